//! `lode controller`: settings for `lode_k8s`'s controller, and its two offline modes
//! (`--print-crd`, `--render`).

use std::sync::Arc;

use anyhow::Context as _;
use lode_k8s::controller::{ControllerConfig, GrpcDispatcher};

use crate::cli::ControllerArgs;

pub fn run_controller(args: ControllerArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    if args.print_crd {
        out.write_all(lode_k8s::crds_yaml()?.as_bytes())?;
        return Ok(());
    }
    if let Some(path) = &args.render {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read the LodeJob", path.display()))?;
        let job = lode_k8s::render::parse_job(&text).with_context(|| path.display().to_string())?;
        let status = args
            .status
            .as_ref()
            .map(|p| {
                let text = std::fs::read_to_string(p).with_context(|| {
                    format!("{}: cannot read the dispatcher status", p.display())
                })?;
                lode_k8s::render::parse_status(&text).with_context(|| p.display().to_string())
            })
            .transpose()?;
        let yaml =
            lode_k8s::render::render(job, status).with_context(|| path.display().to_string())?;
        out.write_all(yaml.as_bytes())?;
        return Ok(());
    }
    let tls = args
        .tls
        .tls_ca
        .as_deref()
        .map(lode_proto::tls::ClientTls::from_ca_file)
        .transpose()?;
    let config = ControllerConfig {
        namespace: args.namespace,
        field_manager: args.field_manager,
        resync: args.resync,
        dispatcher_timeout: args.dispatcher_timeout,
        backoff_base: args.backoff,
        ..ControllerConfig::default()
    };
    let dispatcher = Arc::new(GrpcDispatcher {
        tls,
        timeout: config.dispatcher_timeout,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let client = lode_k8s::controller::client().await?;
        lode_k8s::run(
            client,
            config,
            dispatcher,
            lode_proto::process::stop_requested(),
        )
        .await
    })?;
    Ok(())
}
