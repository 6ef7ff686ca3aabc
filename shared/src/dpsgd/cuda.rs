//! The GPU a CUDA worker runs on, asked of the driver before any model touches it. CubeCL
//! panics where the driver is missing or refuses, and fails a kernel's first maths call
//! without CUDA's libdevice; a worker must say why it cannot start, before its first task.

use std::path::{Path, PathBuf};

use cudarc::driver::{DriverError, result, sys};
use serde::Serialize;

/// Why this machine cannot run CUDA models.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver on this machine (libcuda.so not found): a GPU worker needs the NVIDIA driver")]
    NoDriver,
    #[error("the CUDA driver refused {call}: {error}")]
    Driver { call: &'static str, error: DriverError },
    #[error("the CUDA driver sees no GPU on this machine")]
    NoDevice,
    #[error(
        "CUDA's libdevice.10.bc (the maths kernels' bitcode) is not under {0}/nvvm/libdevice: set CUDA_PATH to the folder the GPU bundle or image ships it in"
    )]
    NoLibdevice(String),
}

/// The first GPU, as its driver describes it: the device every CUDA model runs on.
#[derive(Debug, Clone, Serialize)]
pub struct CudaDevice {
    pub name: String,
    /// The driver's CUDA version, e.g. "12.8".
    pub driver: String,
    /// e.g. "9.0" for an H100.
    pub compute_capability: String,
    pub memory_bytes: u64,
    /// The libdevice kernels link (exp, log, tanh, erf).
    pub libdevice: PathBuf,
}

/// The first GPU, or why there is none.
pub fn probe() -> Result<CudaDevice, CudaError> {
    let refused = |call| move |error| CudaError::Driver { call, error };
    // SAFETY: only tries to dlopen each name the driver library goes by.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    match result::init() {
        Err(DriverError(sys::cudaError_enum::CUDA_ERROR_NO_DEVICE)) => return Err(CudaError::NoDevice),
        other => other.map_err(refused("cuInit"))?,
    }
    if result::device::get_count().map_err(refused("cuDeviceGetCount"))? < 1 {
        return Err(CudaError::NoDevice);
    }
    let device = result::device::get(0).map_err(refused("cuDeviceGet"))?;
    let attribute = |attribute| {
        // SAFETY: `device` is a handle the driver just gave.
        unsafe { result::device::get_attribute(device, attribute) }.map_err(refused("cuDeviceGetAttribute"))
    };
    let major = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let mut version = 0;
    // SAFETY: writes one integer into `version`, which outlives the call.
    unsafe { sys::cuDriverGetVersion(&mut version) }.result().map_err(refused("cuDriverGetVersion"))?;
    Ok(CudaDevice {
        name: result::device::get_name(device).map_err(refused("cuDeviceGetName"))?,
        driver: format!("{}.{}", version / 1000, version % 1000 / 10),
        compute_capability: format!("{major}.{minor}"),
        // SAFETY: as above.
        memory_bytes: unsafe { result::device::total_mem(device) }.map_err(refused("cuDeviceTotalMem"))? as u64,
        libdevice: libdevice()?,
    })
}

/// Where CubeCL's NVPTX backend looks for libdevice: under `$CUDA_PATH`, else the first
/// toolkit folder that has `nvvm/libdevice`.
fn libdevice() -> Result<PathBuf, CudaError> {
    let root = match std::env::var("CUDA_PATH") {
        Ok(path) => PathBuf::from(path),
        Err(_) => ["/usr/local/cuda", "/opt/cuda", "/usr/lib/cuda", "/usr"]
            .into_iter()
            .map(Path::new)
            .find(|root| root.join("nvvm/libdevice").is_dir())
            .unwrap_or(Path::new("/usr/local/cuda"))
            .to_path_buf(),
    };
    let path = root.join("nvvm/libdevice/libdevice.10.bc");
    path.is_file().then_some(path).ok_or_else(|| CudaError::NoLibdevice(root.display().to_string()))
}
