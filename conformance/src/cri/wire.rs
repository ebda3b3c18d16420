//! Just enough protobuf for the CRI messages the harness sends and reads:
//! varint, length-delimited and fixed-width fields, written field by field
//! and read back as a flat list of fields per message.
//!
//! Field numbers are those of `runtime.v1` in the CRI's `api.proto`
//! (k8s.io/cri-api); each call site names the message it writes.

/// A message being written.
#[derive(Debug, Default, Clone)]
pub struct Msg(Vec<u8>);

impl Msg {
    pub fn new() -> Msg {
        Msg(Vec::new())
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        put_varint(&mut self.0, (u64::from(field) << 3) | u64::from(wire_type));
    }

    /// A `string` field; empty strings are omitted, as proto3 does.
    pub fn string(mut self, field: u32, s: &str) -> Msg {
        if !s.is_empty() {
            self.key(field, 2);
            put_varint(&mut self.0, s.len() as u64);
            self.0.extend_from_slice(s.as_bytes());
        }
        self
    }

    /// A `bool`/`uint32`/`int64`/enum field; zero is omitted.
    pub fn varint(mut self, field: u32, v: u64) -> Msg {
        if v != 0 {
            self.key(field, 0);
            put_varint(&mut self.0, v);
        }
        self
    }

    /// An embedded message field (written even when empty: presence can
    /// matter).
    pub fn message(mut self, field: u32, m: Msg) -> Msg {
        self.key(field, 2);
        put_varint(&mut self.0, m.0.len() as u64);
        self.0.extend_from_slice(&m.0);
        self
    }

    /// One entry of a `map<string, string>` field.
    pub fn map_entry(self, field: u32, key: &str, value: &str) -> Msg {
        self.message(field, Msg::new().string(1, key).string(2, value))
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A field's value as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Varint(u64),
    Bytes(Vec<u8>),
    Fixed,
}

/// A decoded message: its fields in wire order.
#[derive(Debug, Clone, Default)]
pub struct Fields(Vec<(u32, Value)>);

/// The bytes are not a protobuf message.
#[derive(Debug, thiserror::Error)]
#[error("malformed protobuf message at byte {0}")]
pub struct Malformed(usize);

impl Fields {
    pub fn parse(bytes: &[u8]) -> Result<Fields, Malformed> {
        let mut fields = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            let key = get_varint(bytes, &mut pos)?;
            let field = u32::try_from(key >> 3).map_err(|_| Malformed(pos))?;
            let value = match key & 7 {
                0 => Value::Varint(get_varint(bytes, &mut pos)?),
                1 => {
                    pos = pos.checked_add(8).ok_or(Malformed(pos))?;
                    Value::Fixed
                }
                2 => {
                    let len = usize::try_from(get_varint(bytes, &mut pos)?)
                        .map_err(|_| Malformed(pos))?;
                    let end = pos.checked_add(len).ok_or(Malformed(pos))?;
                    let v = bytes.get(pos..end).ok_or(Malformed(pos))?.to_vec();
                    pos = end;
                    Value::Bytes(v)
                }
                5 => {
                    pos = pos.checked_add(4).ok_or(Malformed(pos))?;
                    Value::Fixed
                }
                _ => return Err(Malformed(pos)),
            };
            if pos > bytes.len() {
                return Err(Malformed(pos));
            }
            fields.push((field, value));
        }
        Ok(Fields(fields))
    }

    fn bytes_of(&self, field: u32) -> impl Iterator<Item = &[u8]> {
        self.0.iter().filter_map(move |(f, v)| match v {
            Value::Bytes(b) if *f == field => Some(b.as_slice()),
            _ => None,
        })
    }

    /// A `string` field ("" when absent, as proto3 reads it).
    pub fn string(&self, field: u32) -> String {
        self.bytes_of(field)
            .last()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }

    /// A varint field (0 when absent).
    pub fn varint(&self, field: u32) -> u64 {
        self.0
            .iter()
            .rev()
            .find_map(|(f, v)| match v {
                Value::Varint(n) if *f == field => Some(*n),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// An embedded message field (empty when absent).
    pub fn message(&self, field: u32) -> Result<Fields, Malformed> {
        match self.bytes_of(field).last() {
            Some(b) => Fields::parse(b),
            None => Ok(Fields::default()),
        }
    }

    /// A repeated message field.
    pub fn messages(&self, field: u32) -> Result<Vec<Fields>, Malformed> {
        self.bytes_of(field).map(Fields::parse).collect()
    }

    /// A `map<string, string>` field.
    pub fn map(&self, field: u32) -> Result<Vec<(String, String)>, Malformed> {
        self.messages(field)?
            .into_iter()
            .map(|e| Ok((e.string(1), e.string(2))))
            .collect()
    }
}

fn get_varint(bytes: &[u8], pos: &mut usize) -> Result<u64, Malformed> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*pos).ok_or(Malformed(*pos))?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(Malformed(*pos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let inner = Msg::new().string(1, "web-0").varint(4, 3);
        let m = Msg::new()
            .message(1, inner)
            .string(2, "")
            .varint(3, 300)
            .map_entry(6, "k", "v")
            .map_entry(6, "k2", "v2");
        let f = Fields::parse(&m.into_bytes()).unwrap();
        let inner = f.message(1).unwrap();
        assert_eq!(inner.string(1), "web-0");
        assert_eq!(inner.varint(4), 3);
        assert_eq!(f.string(2), "");
        assert_eq!(f.varint(3), 300);
        assert_eq!(
            f.map(6).unwrap(),
            [("k".into(), "v".into()), ("k2".into(), "v2".into())]
        );
    }

    #[test]
    fn truncated_input_is_an_error() {
        let b = Msg::new().string(1, "abcdef").into_bytes();
        assert!(Fields::parse(&b[..4]).is_err());
        assert!(Fields::parse(&[0x80]).is_err());
    }
}
