//! Generates the agent API from `protos/agent.proto` (and containerd's runtime options and
//! shim bootstrap messages from `protos/runtimeoptions.proto` and `protos/bootstrap.proto`)
//! with ttrpc-codegen's pure-Rust
//! parser (no protoc needed), async client and server.
use std::path::PathBuf;

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=protos/agent.proto");
    println!("cargo:rerun-if-changed=protos/runtimeoptions.proto");
    println!("cargo:rerun-if-changed=protos/bootstrap.proto");
    Codegen::new()
        .out_dir(&out)
        .inputs([
            "protos/agent.proto",
            "protos/runtimeoptions.proto",
            "protos/bootstrap.proto",
        ])
        .include("protos")
        .rust_protobuf()
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .run()
        .expect("generating the agent API from protos/agent.proto");

    // The generated files start with inner attributes (`#![allow(..)]`), which `include!`
    // cannot take; lib.rs sets the same allowances on the enclosing modules instead.
    for name in [
        "agent.rs",
        "agent_ttrpc.rs",
        "runtimeoptions.rs",
        "bootstrap.rs",
    ] {
        let path = out.join(name);
        let text = std::fs::read_to_string(&path).expect("reading generated code");
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| {
                let t = l.trim_start();
                !t.starts_with("#![") && !t.starts_with("//!")
            })
            .collect();
        std::fs::write(&path, kept.join("\n")).expect("writing generated code");
    }
}
