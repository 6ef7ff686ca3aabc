//! GGUF (llama.cpp's single-file format, version 2 and 3): metadata and tensors, the
//! tensors dequantized to f32. Every length and offset is checked against the file before
//! it is used, so a truncated or hostile file is an error, never a panic or a huge
//! allocation.

use std::collections::BTreeMap;

use bytes::Bytes;
use half::{bf16, f16};

use super::checkpoint::{CheckpointError, Weights};

const MAGIC: u32 = 0x4655_4747;
const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Uint(v) => Some(*v),
            Value::Int(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(v) => Some(*v),
            Value::Uint(v) => Some(*v as f64),
            Value::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// The storage types this reader dequantizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Storage {
    F32,
    F16,
    Bf16,
    /// Blocks of 32: an f16 scale d and 4-bit q; value d·(q − 8).
    Q4_0,
    /// Blocks of 32: f16 scale d and minimum m, 4-bit q; value d·q + m.
    Q4_1,
    /// Blocks of 32: an f16 scale d and 8-bit signed q; value d·q.
    Q8_0,
}

impl Storage {
    fn of(code: u32) -> Option<Self> {
        Some(match code {
            0 => Storage::F32,
            1 => Storage::F16,
            2 => Storage::Q4_0,
            3 => Storage::Q4_1,
            8 => Storage::Q8_0,
            30 => Storage::Bf16,
            _ => return None,
        })
    }

    /// (values per block, bytes per block).
    fn block(self) -> (usize, usize) {
        match self {
            Storage::F32 => (1, 4),
            Storage::F16 | Storage::Bf16 => (1, 2),
            Storage::Q4_0 => (32, 18),
            Storage::Q4_1 => (32, 20),
            Storage::Q8_0 => (32, 34),
        }
    }

    fn dequantize(self, data: &[u8], out: &mut Vec<f32>) {
        let half = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
        let (_, size) = self.block();
        for block in data.chunks_exact(size) {
            match self {
                Storage::F32 => out.push(f32::from_le_bytes([block[0], block[1], block[2], block[3]])),
                Storage::F16 => out.push(half(block)),
                Storage::Bf16 => out.push(bf16::from_le_bytes([block[0], block[1]]).to_f32()),
                Storage::Q4_0 => {
                    let (d, q) = (half(block), &block[2..]);
                    out.extend(q.iter().map(|b| d * (f32::from(b & 15) - 8.0)));
                    out.extend(q.iter().map(|b| d * (f32::from(b >> 4) - 8.0)));
                }
                Storage::Q4_1 => {
                    let (d, m, q) = (half(block), half(&block[2..]), &block[4..]);
                    out.extend(q.iter().map(|b| d * f32::from(b & 15) + m));
                    out.extend(q.iter().map(|b| d * f32::from(b >> 4) + m));
                }
                Storage::Q8_0 => {
                    let d = half(block);
                    out.extend(block[2..].iter().map(|&b| d * f32::from(b as i8)));
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
struct TensorInfo {
    /// PyTorch order (slowest first); GGUF lists dimensions fastest first.
    shape: Vec<usize>,
    code: u32,
    /// From the start of the data section.
    offset: u64,
}

/// A parsed GGUF file; tensors are dequantized when asked for.
pub struct Gguf {
    metadata: BTreeMap<String, Value>,
    tensors: BTreeMap<String, TensorInfo>,
    bytes: Bytes,
    data_start: usize,
}

fn format(message: impl Into<String>) -> CheckpointError {
    CheckpointError::Format(format!("GGUF: {}", message.into()))
}

/// A bounds-checked reader over the file.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CheckpointError> {
        let end =
            self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| format("file is truncated"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CheckpointError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    fn u32(&mut self) -> Result<u32, CheckpointError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, CheckpointError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count of items of at least `item` bytes each that the rest of the file can hold.
    fn count(&mut self, item: usize) -> Result<usize, CheckpointError> {
        let n = self.u64()?;
        let left = (self.bytes.len() - self.at) as u64;
        if n.saturating_mul(item as u64) > left {
            return Err(format(format!("a count of {n} items overruns the file")));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String, CheckpointError> {
        let n = self.count(1)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| format("a string is not UTF-8"))
    }

    fn value(&mut self, kind: u32, depth: usize) -> Result<Value, CheckpointError> {
        Ok(match kind {
            0 => Value::Uint(u64::from(self.array::<1>()?[0])),
            1 => Value::Int(i64::from(self.array::<1>()?[0] as i8)),
            2 => Value::Uint(u64::from(u16::from_le_bytes(self.array()?))),
            3 => Value::Int(i64::from(i16::from_le_bytes(self.array()?))),
            4 => Value::Uint(u64::from(self.u32()?)),
            5 => Value::Int(i64::from(i32::from_le_bytes(self.array()?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.array()?))),
            7 => Value::Bool(self.array::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 if depth == 0 => {
                let inner = self.u32()?;
                // Each item takes at least a byte (a string: its 8-byte length).
                let n = self.count(if inner == 8 { 8 } else { 1 })?;
                Value::Array((0..n).map(|_| self.value(inner, depth + 1)).collect::<Result<_, _>>()?)
            }
            10 => Value::Uint(self.u64()?),
            11 => Value::Int(i64::from_le_bytes(self.array()?)),
            12 => Value::Float(f64::from_le_bytes(self.array()?)),
            _ => return Err(format(format!("metadata value type {kind} is not supported"))),
        })
    }
}

impl Gguf {
    pub fn parse(bytes: Bytes) -> Result<Self, CheckpointError> {
        let mut c = Cursor { bytes: &bytes, at: 0 };
        if c.u32()? != MAGIC {
            return Err(format("not a GGUF file (bad magic)"));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(format(format!("version {version} (2 and 3 are read)")));
        }
        let tensor_count = c.count(24)?;
        let kv_count = c.count(12)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = c.string()?;
            let kind = c.u32()?;
            metadata.insert(key, c.value(kind, 0)?);
        }
        let mut tensors = BTreeMap::new();
        for _ in 0..tensor_count {
            let name = c.string()?;
            let dims = c.u32()? as usize;
            if dims == 0 || dims > 4 {
                return Err(format(format!("tensor {name} has {dims} dimensions")));
            }
            let mut shape = (0..dims)
                .map(|_| c.u64().and_then(|d| usize::try_from(d).map_err(|_| format("a dimension overflows"))))
                .collect::<Result<Vec<_>, _>>()?;
            shape.reverse();
            let code = c.u32()?;
            let offset = c.u64()?;
            tensors.insert(name, TensorInfo { shape, code, offset });
        }
        let alignment = metadata.get("general.alignment").and_then(Value::as_u64).unwrap_or(DEFAULT_ALIGNMENT);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(format(format!("alignment {alignment}")));
        }
        let data_start = (c.at as u64).div_ceil(alignment) * alignment;
        if data_start > bytes.len() as u64 {
            return Err(format("file is truncated before its data"));
        }
        Ok(Self { metadata, tensors, data_start: data_start as usize, bytes })
    }

    /// The file's size in bytes.
    pub fn file_size(&self) -> usize {
        self.bytes.len()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// A metadata value that must be there.
    pub fn require(&self, key: &str) -> Result<&Value, CheckpointError> {
        self.get(key).ok_or_else(|| format(format!("metadata {key} is missing")))
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A tensor's shape in PyTorch order.
    pub fn tensor_shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|t| t.shape.as_slice())
    }

    /// A tensor dequantized to f32 in PyTorch layout; `None` when the file has no such name.
    pub fn tensor(&self, name: &str) -> Result<Option<Weights>, CheckpointError> {
        let Some(info) = self.tensors.get(name) else { return Ok(None) };
        let storage = Storage::of(info.code).ok_or_else(|| {
            format(format!(
                "tensor {name} is stored as type {}; rhosynth dequantizes F32, F16, BF16, Q4_0, Q4_1 and Q8_0",
                info.code
            ))
        })?;
        let count =
            info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| format("size overflows"))?;
        let (per_block, block_bytes) = storage.block();
        if count % per_block != 0 {
            return Err(format(format!("tensor {name} of {count} values is not whole blocks of {per_block}")));
        }
        let size = (count / per_block).checked_mul(block_bytes).ok_or_else(|| format("size overflows"))?;
        let range = (self.data_start as u64)
            .checked_add(info.offset)
            .and_then(|s| usize::try_from(s).ok())
            .and_then(|s| s.checked_add(size).map(|e| s..e))
            .filter(|r| r.end <= self.bytes.len())
            .ok_or_else(|| format(format!("tensor {name} lies outside the file")))?;
        let mut values = Vec::with_capacity(count);
        storage.dequantize(&self.bytes[range], &mut values);
        Ok(Some(Weights { shape: info.shape.clone(), values }))
    }
}
