//! `lode controller`: settings for `lode_k8s`'s controller, and its two offline modes
//! (`--print-crd`, `--render`).

use std::sync::Arc;

use anyhow::Context as _;
use lode_k8s::controller::{ControllerConfig, GrpcDispatcher};

use crate::cli::{ControllerArgs, OutputFormat};

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
        let objects = lode_k8s::render::render_objects(job, status)
            .with_context(|| path.display().to_string())?;
        match args.format {
            OutputFormat::Text => {
                let yaml = lode_k8s::render::yaml_stream(objects)
                    .context("cannot write the objects as YAML")?;
                out.write_all(yaml.as_bytes())?;
            }
            OutputFormat::Json => {
                writeln!(out, "{}", serde_json::Value::Array(objects))?;
            }
        }
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

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::cli::{Cli, Command};

    /// Each rendered worker container's command line is one `lode worker` takes: the flags the
    /// planner writes exist, with values of their types. (The token comes from the
    /// environment, LODE_TOKEN, in the pod; here it is given as the flag it stands for.)
    #[test]
    fn rendered_worker_commands_parse_as_lode_worker() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/samples");
        let status = std::fs::read_to_string(root.join("dispatcher-status.json")).expect("status");
        let mut checked = 0;
        for sample in ["lodejob.yaml", "lodejob-tls.yaml"] {
            let text = std::fs::read_to_string(root.join(sample)).expect("sample");
            let job = lode_k8s::render::parse_job(&text).expect("sample LodeJob");
            let status = lode_k8s::render::parse_status(&status).expect("sample status");
            let yaml = lode_k8s::render::render(job, Some(status)).expect("render");
            for doc in yaml
                .split("---\n")
                .filter(|d| d.contains("kind: Deployment"))
            {
                let deployment = lode_k8s::render::yaml_to_json(doc).expect("rendered YAML");
                let container = &deployment["spec"]["template"]["spec"]["containers"][0];
                let mut argv: Vec<String> = vec![container["command"][0]
                    .as_str()
                    .expect("command")
                    .to_owned()];
                for arg in container["args"].as_array().expect("args") {
                    argv.push(
                        arg.as_str()
                            .expect("string arg")
                            .replace("$(POD_NAME)", "pod-0"),
                    );
                }
                assert_eq!(container["env"][0]["name"], "LODE_TOKEN");
                argv.extend(["--token".to_owned(), "t0ken".to_owned()]);
                let cli = Cli::try_parse_from(&argv)
                    .unwrap_or_else(|e| panic!("{sample}: {argv:?} is not a lode command: {e}"));
                let Command::Worker(args) = cli.command else {
                    panic!("{sample}: {argv:?} is not `lode worker`")
                };
                assert!(
                    args.dispatcher.contains("-lode-dispatcher."),
                    "{}",
                    args.dispatcher
                );
                assert_eq!(args.name.as_deref(), Some("pod-0"));
                assert!(args.stage.is_some());
                assert_eq!(
                    args.tls.tls_ca.is_some(),
                    args.dispatcher.starts_with("https://"),
                    "a CA exactly for https"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 4, "two stages of two samples");
    }
}
