//! Compiles `rhosynth.proto` with protox (no system protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=rhosynth.proto");
    let descriptors = protox::compile(["rhosynth.proto"], ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
