//! The API calls the controller makes, in one list: the RBAC rules in `deploy/rbac.yaml` are
//! checked against it (a test in this module), and the controller's mock-API-server tests check
//! that every request the controller sends is one of them.

/// One permission: `verbs` on `resource` (a subresource as `resource/sub`) of API `group`
/// (`""`: the core group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// Where the code makes the call.
    pub why: &'static str,
}

/// Every call the controller makes. Server-side apply is a `patch`, and also needs `create`
/// when the object does not exist yet.
pub const CONTROLLER_CALLS: &[ApiCall] = &[
    ApiCall {
        group: "lode.dev",
        resource: "lodejobs",
        verbs: &["list", "watch"],
        why: "the Controller's watch of LodeJobs (and the start-up check that the CRD is served)",
    },
    ApiCall {
        group: "lode.dev",
        resource: "lodejobs/status",
        verbs: &["patch"],
        why: "the job's status subresource",
    },
    ApiCall {
        group: "lode.dev",
        resource: "lodepools",
        verbs: &["list", "watch", "create", "patch", "delete"],
        why: "one pool per stage: watched (owns), listed per job, applied, deleted when the cut has fewer stages",
    },
    ApiCall {
        group: "lode.dev",
        resource: "lodepools/status",
        verbs: &["patch"],
        why: "a pool's replicas and selector, from its Deployment",
    },
    ApiCall {
        group: "apps",
        resource: "deployments",
        verbs: &["list", "watch", "create", "patch", "delete"],
        why: "each pool's data workers",
    },
    ApiCall {
        group: "",
        resource: "services",
        verbs: &["list", "watch", "create", "patch"],
        why: "the dispatcher's Service",
    },
    ApiCall {
        group: "",
        resource: "secrets",
        verbs: &["list", "watch", "create", "patch"],
        why: "the job's token Secret (made once; read back for the dispatcher's Status RPC)",
    },
];

/// Every call the scheduler's Kubernetes backend makes (`crate::scheduler`).
pub const SCHEDULER_CALLS: &[ApiCall] = &[
    ApiCall {
        group: "",
        resource: "nodes",
        verbs: &["list"],
        why: "each round: allocatable CPU, memory and GPUs, labels, schedulability",
    },
    ApiCall {
        group: "",
        resource: "pods",
        verbs: &["list", "patch", "delete"],
        why: "each round: what other pods request per node, the training pods' nodes, each pool's pods; a drained pod's deletion cost; a migrated pod deleted",
    },
    ApiCall {
        group: "",
        resource: "secrets",
        verbs: &["get"],
        why: "a job's token, for its dispatcher's Status and Drain RPCs",
    },
    ApiCall {
        group: "",
        resource: "events",
        verbs: &["create"],
        why: "an Event on the LodeJob per decision",
    },
    ApiCall {
        group: "lode.dev",
        resource: "lodejobs",
        verbs: &["list"],
        why: "each round: the jobs, their dispatchers and training selectors",
    },
    ApiCall {
        group: "lode.dev",
        resource: "lodepools",
        verbs: &["list"],
        why: "each round: the pools, their bounds, sizes and scalers",
    },
    ApiCall {
        group: "lode.dev",
        resource: "lodepools/scale",
        verbs: &["patch"],
        why: "a pool's replicas",
    },
    ApiCall {
        group: "apps",
        resource: "deployments",
        verbs: &["list", "patch"],
        why: "each pool's Deployment: its template's node affinity",
    },
];

/// The calls as `(verb, group, resource)` triples, sorted.
pub fn triples(calls: &[ApiCall]) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = calls
        .iter()
        .flat_map(|c| {
            c.verbs
                .iter()
                .map(|v| ((*v).to_owned(), c.group.to_owned(), c.resource.to_owned()))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether `(verb, group, resource)` is among `calls`.
pub fn allows(calls: &[ApiCall], verb: &str, group: &str, resource: &str) -> bool {
    calls
        .iter()
        .any(|c| c.group == group && c.resource == resource && c.verbs.contains(&verb))
}
