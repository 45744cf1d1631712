//! `lode controller`'s offline modes: `--print-crd` prints the committed CRDs, `--render`
//! prints a LodeJob's objects (and nothing of the token outside its Secret), bad input exits 2
//! with one line naming the file and the problem. (The controller's reconcile loop is tested
//! against a mock API server in the lode-k8s crate.)

use crate::support::{lode, ok, repo, stderr};

fn sample(file: &str) -> String {
    repo()
        .join("deploy/samples")
        .join(file)
        .to_str()
        .expect("UTF-8 path")
        .to_owned()
}

#[test]
fn print_crd_prints_the_committed_crds() {
    let printed = ok(&lode(&["controller", "--print-crd"]));
    let committed =
        std::fs::read_to_string(repo().join("deploy/crds.yaml")).expect("deploy/crds.yaml");
    assert!(
        printed == committed,
        "deploy/crds.yaml differs from `lode controller --print-crd`: regenerate it"
    );
}

/// The kinds rendered for the sample LodeJob once its dispatcher reports two stages.
const RUNNING_KINDS: [&str; 6] = [
    "Secret",
    "Service",
    "LodePool",
    "Deployment",
    "LodePool",
    "Deployment",
];

#[test]
fn render_prints_the_secret_service_and_a_pool_per_stage() {
    let out = ok(&lode(&[
        "controller",
        "--render",
        &sample("lodejob.yaml"),
        "--status",
        &sample("dispatcher-status.json"),
    ]));
    let kinds: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .collect();
    assert_eq!(kinds, RUNNING_KINDS, "{out}");
    assert!(out.contains("name: wide-deep-lode-stage-1"), "{out}");
    assert!(
        out.contains("http://wide-deep-lode-dispatcher.default.svc:7070"),
        "{out}"
    );
    // Without a dispatcher status only the Secret and the Service; each run draws a new token.
    let first = ok(&lode(&["controller", "--render", &sample("lodejob.yaml")]));
    let second = ok(&lode(&["controller", "--render", &sample("lodejob.yaml")]));
    let top_kinds = first.lines().filter(|l| l.starts_with("kind: ")).count();
    assert_eq!(top_kinds, 2, "{first}");
    let token = |yaml: &str| {
        yaml.lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .expect("the Secret's token")
            .to_owned()
    };
    assert_ne!(token(&first), token(&second));
    assert_eq!(
        first.matches(&token(&first)).count(),
        1,
        "the token once, in the Secret"
    );
}

fn expect_bad(args: &[&str], names: &str, problem: &str) {
    let out = lode(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "stdout on error");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(lines[0].starts_with("lode: error: "), "{err}");
    assert!(lines[0].contains(names), "does not name {names}: {err}");
    assert!(
        lines[0].contains(problem),
        "does not say {problem:?}: {err}"
    );
}

#[test]
fn bad_input_exits_2_naming_the_file_and_the_problem() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("UTF-8").to_owned()
    };
    let sample_text = std::fs::read_to_string(sample("lodejob.yaml")).expect("sample");

    let missing = dir.path().join("absent.yaml");
    let missing = missing.to_str().expect("UTF-8");
    expect_bad(
        &["controller", "--render", missing],
        "absent.yaml",
        "cannot read",
    );

    let invalid = write(
        "invalid.yaml",
        &sample_text.replace("memory: 1Gi", "memory: plenty"),
    );
    expect_bad(
        &["controller", "--render", &invalid],
        "invalid.yaml",
        "spec.workers.memory",
    );

    let wrong = write(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n",
    );
    expect_bad(&["controller", "--render", &wrong], "pod.yaml", "v1/Pod");

    let garbage = write(
        "garbage.yaml",
        "apiVersion: lode.dev/v1alpha1\nkind: LodeJob\nspec: [1, 2\n",
    );
    expect_bad(
        &["controller", "--render", &garbage],
        "garbage.yaml",
        "LodeJob",
    );

    let status = write("status.json", "{\"stages\": -1}");
    expect_bad(
        &[
            "controller",
            "--render",
            &sample("lodejob.yaml"),
            "--status",
            &status,
        ],
        "status.json",
        "dispatcher status",
    );
}

#[test]
fn status_without_render_is_a_usage_error() {
    let out = lode(&["controller", "--status", "x.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--render"), "{}", stderr(&out));
}

#[test]
fn render_as_json_is_the_same_objects_as_the_yaml() {
    let json = ok(&lode(&[
        "controller",
        "--render",
        &sample("lodejob.yaml"),
        "--status",
        &sample("dispatcher-status.json"),
        "--format",
        "json",
    ]));
    let objects: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("not JSON: {e}: {json}"));
    let kinds: Vec<&str> = objects
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {json}"))
        .iter()
        .filter_map(|o| o["kind"].as_str())
        .collect();
    assert_eq!(kinds, RUNNING_KINDS, "{json}");
    let worker = &objects[3]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(worker["env"][0]["name"], "LODE_TOKEN");
    assert!(
        worker["env"][0]["valueFrom"]["secretKeyRef"].is_object(),
        "{worker}"
    );
}
