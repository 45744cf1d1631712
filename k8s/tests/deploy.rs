//! deploy/ against the code: the committed CRDs are the generated ones, the RBAC rules are the
//! calls the controller makes, and the sample LodeJob is one the controller takes as written.

use std::path::PathBuf;

use kube::ResourceExt as _;
use lode_k8s::rbac::{triples, ApiCall, CONTROLLER_CALLS, SCHEDULER_CALLS};
use lode_k8s::render;
use serde_json::Value;

fn deploy(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(deploy(file)).unwrap_or_else(|e| panic!("deploy/{file}: {e}"))
}

fn documents(text: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn the_committed_crds_are_the_generated_ones() {
    let generated = lode_k8s::crds_yaml().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        read("crds.yaml") == generated,
        "deploy/crds.yaml is stale: regenerate it with `lode controller --print-crd > deploy/crds.yaml`"
    );
}

#[test]
fn the_cluster_role_grants_exactly_the_calls_the_controller_makes() {
    role_grants_exactly(
        "rbac.yaml",
        "lode-controller",
        CONTROLLER_CALLS,
        "controller.yaml",
    );
}

#[test]
fn the_schedulers_cluster_role_grants_exactly_the_calls_it_makes() {
    role_grants_exactly(
        "scheduler-rbac.yaml",
        "lode-scheduler",
        SCHEDULER_CALLS,
        "scheduler.yaml",
    );
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let kustomization = documents(&read("kustomization.yaml"));
    let listed: Vec<&str> = kustomization[0]["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("no resources"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for file in [
        "crds.yaml",
        "rbac.yaml",
        "controller.yaml",
        "scheduler-rbac.yaml",
        "scheduler.yaml",
    ] {
        assert!(listed.contains(&file), "kustomization.yaml lacks {file}");
    }
}

fn role_grants_exactly(file: &str, name: &str, calls: &[ApiCall], deployment: &str) {
    let docs = documents(&read(file));
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ClusterRole {name} in deploy/{file}"));
    let mut granted = Vec::new();
    for rule in role["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("no rules"))
    {
        let strings = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .unwrap_or_else(|| panic!("rule without {key}: {rule}"))
                .iter()
                .map(|v| {
                    v.as_str()
                        .unwrap_or_else(|| panic!("{key}: {v}"))
                        .to_owned()
                })
                .collect()
        };
        for verb in strings("verbs") {
            assert_ne!(verb, "*", "no wildcard verbs");
            for group in strings("apiGroups") {
                for resource in strings("resources") {
                    assert_ne!(resource, "*", "no wildcard resources");
                    granted.push((verb.clone(), group.clone(), resource));
                }
            }
        }
    }
    granted.sort();
    granted.dedup();
    assert_eq!(granted, triples(calls));
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .unwrap_or_else(|| panic!("no ClusterRoleBinding"));
    assert_eq!(binding["roleRef"]["name"], name);
    assert_eq!(binding["subjects"][0]["name"], name);
    let workload = documents(&read(deployment));
    assert_eq!(
        workload[0]["spec"]["template"]["spec"]["serviceAccountName"],
        name
    );
}

/// Every field of `want` survives in `have` (a field the types do not know would be dropped).
fn every_field_kept(want: &Value, have: &Value, at: &str) {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            for (k, v) in w {
                let next = format!("{at}.{k}");
                let hv = h
                    .get(k)
                    .unwrap_or_else(|| panic!("{next} is not a field of the type"));
                every_field_kept(v, hv, &next);
            }
        }
        (Value::Array(w), Value::Array(h)) => {
            assert_eq!(w.len(), h.len(), "{at}");
            for (i, (a, b)) in w.iter().zip(h).enumerate() {
                every_field_kept(a, b, &format!("{at}[{i}]"));
            }
        }
        _ => assert_eq!(want, have, "{at}"),
    }
}

#[test]
fn the_sample_lodejobs_are_valid_as_written_and_render() {
    for sample in ["samples/lodejob.yaml", "samples/lodejob-tls.yaml"] {
        sample_is_valid_and_renders(sample);
    }
}

fn sample_is_valid_and_renders(sample: &str) {
    // The schema tool cannot check a custom resource; this checks it against the Rust types
    // the CRD's schema is generated from: every field known, every value of its type, the
    // controller's validation passes. (CI also checks it against the generated schema itself:
    // tests/k8s/validate.py.)
    let text = read(sample);
    let job = render::parse_job(&text).unwrap_or_else(|e| panic!("deploy/{sample}: {e}"));
    let written: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    let typed = serde_json::to_value(&job).unwrap_or_else(|e| panic!("{e}"));
    every_field_kept(&written, &typed, "");
    assert_eq!(job.spec.validate(&job.name_any()), vec![]);

    let status = render::parse_status(&read("samples/dispatcher-status.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    let yaml = render::render(job, Some(status)).unwrap_or_else(|e| panic!("{e}"));
    let objects = documents(&yaml);
    let pools = objects.iter().filter(|o| o["kind"] == "LodePool").count();
    assert_eq!(pools, 2, "one pool per stage of the status");
    for pool in objects.iter().filter(|o| o["kind"] == "LodePool") {
        let typed: lode_k8s::LodePool =
            serde_json::from_value(pool.clone()).unwrap_or_else(|e| panic!("LodePool: {e}"));
        every_field_kept(
            pool,
            &serde_json::to_value(&typed).unwrap_or_default(),
            "LodePool",
        );
    }
    let secret = &objects[0];
    let token = secret["data"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token"));
    for other in &objects[1..] {
        assert!(!other.to_string().contains(token), "the token leaked");
    }
}

#[test]
fn the_training_job_reads_the_token_the_controller_makes() {
    let job = render::parse_job(&read("samples/lodejob.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let training = documents(&read("samples/training-job.yaml"));
    let pod = &training[0]["spec"]["template"];
    for (k, v) in &job.spec.training_selector {
        assert_eq!(
            pod["metadata"]["labels"][k],
            v.as_str(),
            "the Service selects the pod"
        );
    }
    let container = &pod["spec"]["containers"][0];
    assert_eq!(
        container["env"][0]["valueFrom"]["secretKeyRef"]["name"],
        lode_k8s::plan::secret_name(&job.name_any())
    );
    assert_eq!(
        container["ports"][0]["containerPort"],
        job.spec.dispatcher_port
    );
}
