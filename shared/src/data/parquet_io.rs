//! Parquet over object_store: writing through object_store's `BufWriter` (multipart for
//! large objects), reading through an `AsyncFileReader` that fetches byte ranges.

use std::ops::Range;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, TryFutureExt};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStream};
use parquet::arrow::{AsyncArrowWriter, ParquetRecordBatchStreamBuilder};
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::WriterProperties;

fn external(e: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

/// Reads one Parquet object by byte ranges.
pub struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        self.store.get_range(&self.path, range).map_err(external).boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, Result<Vec<Bytes>>> {
        async move { self.store.get_ranges(&self.path, &ranges).await.map_err(external) }.boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let metadata =
                ParquetMetaDataReader::new().with_arrow_reader_options(options).load_and_finish(self, size).await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

/// Opens a Parquet object for streaming record batches of `batch_rows` rows.
pub async fn open_stream(
    store: Arc<dyn ObjectStore>,
    path: Path,
    batch_rows: usize,
) -> Result<(SchemaRef, ParquetRecordBatchStream<ObjectReader>)> {
    open_row_groups(store, path, batch_rows, None).await
}

/// [`open_stream`] of only `row_groups` (all of them when `None`).
pub async fn open_row_groups(
    store: Arc<dyn ObjectStore>,
    path: Path,
    batch_rows: usize,
    row_groups: Option<Vec<usize>>,
) -> Result<(SchemaRef, ParquetRecordBatchStream<ObjectReader>)> {
    let size = store.head(&path).await.map_err(external)?.size;
    let mut builder = ParquetRecordBatchStreamBuilder::new(ObjectReader { store, path, size }).await?;
    if let Some(row_groups) = row_groups {
        let present = builder.metadata().num_row_groups();
        if let Some(missing) = row_groups.iter().find(|&&g| g >= present) {
            return Err(ParquetError::General(format!("no row group {missing}: the file has {present}")));
        }
        builder = builder.with_row_groups(row_groups);
    }
    let schema = builder.schema().clone();
    Ok((schema, builder.with_batch_size(batch_rows).build()?))
}

/// The rows of each row group of a Parquet object, from its footer alone.
pub async fn row_group_rows(store: Arc<dyn ObjectStore>, path: Path) -> Result<Vec<u64>> {
    let size = store.head(&path).await.map_err(external)?.size;
    let mut reader = ObjectReader { store, path, size };
    let metadata = reader.get_metadata(None).await?;
    Ok(metadata.row_groups().iter().map(|g| g.num_rows().max(0) as u64).collect())
}

/// Rows per row group of what rhosynth writes: a writer buffers one row group, so this
/// bounds its memory whatever the number of rows (the format's default, 2²⁰ rows, would
/// buffer whole partitions of most data sets).
const ROW_GROUP_ROWS: usize = 65_536;

/// Bytes an upload buffers before it turns multipart, and the size of each part: S3's
/// smallest part. With [`UPLOAD_PARTS_IN_FLIGHT`] it bounds a writer's upload memory at
/// 15 MiB (object_store's defaults, 10 MiB parts and 8 in flight, allow 90 MiB, and the
/// coordinator holds one writer per partition).
const UPLOAD_PART_BYTES: usize = 5 * 1024 * 1024;
const UPLOAD_PARTS_IN_FLIGHT: usize = 2;

/// A streaming Parquet writer into one object.
pub fn create_writer(
    store: Arc<dyn ObjectStore>,
    path: Path,
    schema: SchemaRef,
) -> Result<AsyncArrowWriter<BufWriter>> {
    let properties = WriterProperties::builder().set_max_row_group_row_count(Some(ROW_GROUP_ROWS)).build();
    let upload = BufWriter::with_capacity(store, path, UPLOAD_PART_BYTES).with_max_concurrency(UPLOAD_PARTS_IN_FLIGHT);
    AsyncArrowWriter::try_new(upload, schema, Some(properties))
}
