//! Compiles `dpsynth.proto` with protox (no system protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=dpsynth.proto");
    let descriptors = protox::compile(["dpsynth.proto"], ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
