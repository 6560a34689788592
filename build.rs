//! Compiles our Talos/COSI proto subset with protox (pure Rust, so no protoc is needed) and
//! generates the tonic client and server code from the resulting descriptor set.

const PROTOS: &[&str] = &[
    "common/common.proto",
    "machine/machine.proto",
    "machine/image.proto",
    "machine/lifecycle.proto",
    "resource/config/config.proto",
    "cosi/resource.proto",
    "cosi/state.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Small first buffers per call (src/talos/codec.rs).
        .codec_path("crate::talos::codec::SmallCodec")
        .compile_fds(fds)?;
    Ok(())
}
