//! A worker's result as it streams in: a header declaring f64 tensors, then chunks of
//! their bytes. Workers are not trusted for their results, so every size a header claims
//! is checked (no overflow, a cap on what one result may hold) and no tensor may receive
//! more bytes than it declared: a hostile worker cannot make the coordinator buffer more
//! than the cap. What the values mean is checked later, by the generator that asked.

pub use rhosynth_proto::MAX_RESULT_VALUES;
use rhosynth_proto::{Dtype, ResultHeader, TensorChunk};

use crate::scheduler::TaskResult;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResultError {
    #[error("tensor '{0}': only f64 is supported")]
    Dtype(String),
    #[error("the result declares more than {MAX_RESULT_VALUES} values")]
    TooLarge,
    #[error("chunk for an undeclared tensor")]
    UndeclaredTensor,
    #[error("tensor '{0}' received more bytes than its shape declares")]
    Overflow(String),
    #[error("tensor '{0}' has the wrong number of values")]
    Incomplete(String),
}

/// A result being received.
#[derive(Debug)]
pub struct ResultStream {
    header: ResultHeader,
    /// Bytes received per tensor, and the bytes each declared.
    buffers: Vec<(Vec<u8>, usize)>,
}

impl ResultStream {
    /// Checks a header's declarations.
    pub fn new(header: ResultHeader) -> Result<Self, ResultError> {
        let mut total = 0u64;
        let mut buffers = Vec::with_capacity(header.tensors.len());
        for meta in &header.tensors {
            if meta.dtype != Dtype::F64 as i32 {
                return Err(ResultError::Dtype(meta.name.clone()));
            }
            let values = meta.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).ok_or(ResultError::TooLarge)?;
            total = total.checked_add(values).filter(|t| *t <= MAX_RESULT_VALUES).ok_or(ResultError::TooLarge)?;
            buffers.push((Vec::new(), values as usize * 8));
        }
        Ok(Self { header, buffers })
    }

    /// The header, for routing the result to its job.
    pub fn header(&self) -> &ResultHeader {
        &self.header
    }

    /// Appends a chunk to its tensor.
    pub fn push(&mut self, chunk: TensorChunk) -> Result<(), ResultError> {
        let index = chunk.tensor_index as usize;
        let (buffer, declared) = self.buffers.get_mut(index).ok_or(ResultError::UndeclaredTensor)?;
        if buffer.len() + chunk.data.len() > *declared {
            return Err(ResultError::Overflow(self.header.tensors[index].name.clone()));
        }
        buffer.extend_from_slice(&chunk.data);
        Ok(())
    }

    /// The decoded result, once every tensor holds exactly what it declared.
    pub fn finish(self) -> Result<TaskResult, ResultError> {
        let mut tensors = Vec::with_capacity(self.buffers.len());
        for (meta, (bytes, declared)) in self.header.tensors.into_iter().zip(self.buffers) {
            if bytes.len() != declared {
                return Err(ResultError::Incomplete(meta.name));
            }
            let values = bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
            tensors.push((meta.name, values));
        }
        Ok(TaskResult {
            task_id: self.header.task_id,
            worker: self.header.worker_id,
            units: self.header.units,
            tensors,
            seconds: 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rhosynth_proto::TensorMeta;

    fn header(shape: Vec<u64>) -> ResultHeader {
        let tensors = vec![TensorMeta { name: "sum".into(), shape, dtype: Dtype::F64 as i32 }];
        ResultHeader { worker_id: "w".into(), job_id: "j".into(), task_id: 0, attempt: 1, units: 1, tensors }
    }

    /// A hostile worker could once make the coordinator buffer whatever it streamed.
    #[test]
    fn a_result_holds_no_more_than_it_declares_and_declares_within_the_cap() {
        assert_eq!(ResultStream::new(header(vec![1 << 20, 1 << 20])).unwrap_err(), ResultError::TooLarge);
        assert_eq!(ResultStream::new(header(vec![u64::MAX, 2])).unwrap_err(), ResultError::TooLarge);
        let mut stream = ResultStream::new(header(vec![2])).unwrap();
        stream.push(TensorChunk { tensor_index: 0, data: 1.5f64.to_le_bytes().to_vec() }).unwrap();
        let too_much = TensorChunk { tensor_index: 0, data: vec![0; 16] };
        assert_eq!(stream.push(too_much).unwrap_err(), ResultError::Overflow("sum".into()));
        assert_eq!(
            stream.push(TensorChunk { tensor_index: 1, data: vec![] }).unwrap_err(),
            ResultError::UndeclaredTensor
        );
        stream.push(TensorChunk { tensor_index: 0, data: (-2.0f64).to_le_bytes().to_vec() }).unwrap();
        assert_eq!(stream.finish().unwrap().tensors, [("sum".to_string(), vec![1.5, -2.0])]);
        let short = ResultStream::new(header(vec![2])).unwrap();
        assert_eq!(short.finish().unwrap_err(), ResultError::Incomplete("sum".into()));
    }
}
