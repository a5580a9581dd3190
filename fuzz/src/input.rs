//! A tiny reader that turns fuzzer bytes into structured choices, the same way in the fuzz
//! targets and in the seed-corpus tests (which replay `fuzz/seeds/` without nightly).

/// Reads choices from the front of a byte string; once it is used up every read returns 0.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    bytes: &'a [u8],
}

impl<'a> Input<'a> {
    /// A reader over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// One byte (0 when exhausted).
    pub fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    /// A little-endian u64 from the next 8 bytes (zero-padded when fewer remain).
    pub fn u64(&mut self) -> u64 {
        let mut buf = [0u8; 8];
        let n = self.bytes.len().min(8);
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        u64::from_le_bytes(buf)
    }

    /// One of `items`, chosen by the next byte.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[usize::from(self.byte()) % items.len()]
    }

    /// The bytes up to the next `sep` (or the end), consuming the separator.
    pub fn until(&mut self, sep: u8) -> &'a [u8] {
        match self.bytes.iter().position(|&b| b == sep) {
            Some(i) => {
                let (head, rest) = self.bytes.split_at(i);
                self.bytes = &rest[1..];
                head
            }
            None => self.rest(),
        }
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}
