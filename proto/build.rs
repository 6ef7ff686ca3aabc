//! Compiles `rhosynth.proto` with protox (no system protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=rhosynth.proto");
    let descriptors = protox::compile(["rhosynth.proto"], ["."])?;
    // A shard task carries the job's partition key: its `Debug` (lib.rs) never prints it.
    tonic_prost_build::configure().skip_debug([".rhosynth.v1.ReadShard"]).compile_fds(descriptors)?;
    Ok(())
}
