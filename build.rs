//! Compiles the gRPC schemas (schemas/freqcap/v1/freqcap.proto, and the
//! vendored subset of Envoy's rate limit service in schemas/envoy/) with protox,
//! a protobuf compiler in Rust, so building freqcap needs no system `protoc`;
//! tonic-prost-build generates the services, and the descriptor set is kept
//! for gRPC reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "schemas/freqcap/v1/freqcap.proto",
        "schemas/envoy/service/ratelimit/v3/rls.proto",
    ];
    println!("cargo:rerun-if-changed=schemas/freqcap");
    println!("cargo:rerun-if-changed=schemas/envoy");
    let fds = protox::compile(protos, ["schemas"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("freqcap_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost's codec, but a message that does not decode is
        // INVALID_ARGUMENT, not INTERNAL (src/grpc/convert.rs).
        .codec_path("crate::grpc::codec::Codec")
        .compile_fds(fds)?;
    Ok(())
}
