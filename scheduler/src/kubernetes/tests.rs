//! Tests of the Kubernetes mapping: snapshots, pool plans against `decide`, and the scale-in
//! property.

use super::*;
use crate::policy::{decide, plan, target, DecideConfig};

const GIB: u64 = 1 << 30;

fn node(name: &str, alloc_m: u64, other_m: u64, gpus: u32) -> NodeFacts {
    NodeFacts {
        name: name.to_owned(),
        allocatable_cpu_millicores: alloc_m,
        allocatable_memory_bytes: 256 * GIB,
        other_cpu_requests_millicores: other_m,
        other_memory_requests_bytes: 0,
        gpus,
        labels: BTreeMap::new(),
        schedulable: true,
    }
}

fn pod(name: &str, node: Option<&str>) -> WorkerPodFacts {
    WorkerPodFacts {
        name: name.to_owned(),
        node: node.map(str::to_owned),
        terminating: false,
    }
}

fn pool(stage: u32, name: &str, cpu_m: u64, pods: Vec<WorkerPodFacts>) -> PoolFacts {
    PoolFacts {
        stage,
        name: name.to_owned(),
        worker_cpu_millicores: cpu_m,
        worker_memory_bytes: GIB,
        min_workers: 0,
        max_workers: 0,
        pods,
    }
}

/// A job's counters after `secs` of training with its pods' workers each making `rate`
/// steps/s of compute and the training side consuming at most `consume` steps/s of busy
/// time (single-stage unless the pools say otherwise: every stage computes every step).
fn counters(job: &JobFacts, secs: f64, rate: f64, consume: f64) -> DispatcherCounters {
    let per_stage: Vec<usize> = job.pools.iter().map(|p| p.pods.len()).collect();
    #[allow(clippy::cast_precision_loss)]
    let production = per_stage
        .iter()
        .map(|n| *n as f64 * rate)
        .fold(f64::INFINITY, f64::min);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let steps = (production.min(consume) * secs) as u64;
    let mut workers = Vec::new();
    let mut id = 1;
    for pool in &job.pools {
        let n = u64::try_from(pool.pods.len()).unwrap_or(1).max(1);
        for p in &pool.pods {
            let mine = steps / n;
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss
            )]
            let us = (mine as f64 / rate * 1e6) as u64;
            workers.push(DispatcherWorker {
                id,
                name: p.name.clone(),
                stage: pool.stage,
                draining: false,
                steps_computed: mine,
                compute_us: us,
            });
            id += 1;
        }
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    DispatcherCounters {
        at_s: secs,
        steps_consumed: steps,
        steps_computed: workers.iter().map(|w| w.steps_computed).sum(),
        compute_us: workers.iter().map(|w| w.compute_us).sum(),
        consumer_busy_us: (steps as f64 / consume * 1e6) as u64,
        steps_per_epoch: 1_000_000,
        epochs: 1,
        epoch: 0,
        end_of_data: false,
        workers,
    }
}

/// Two jobs with different appetites: `a` has one 4-CPU worker making 25 steps/s for a
/// training side that takes 100 (it wants four); `b` has three 2-CPU workers of 100 steps/s
/// each for a training side that takes 100 (one would do). Their training pods are on
/// `gpu-a` and `gpu-b`; `cpu-1` is a CPU-only node. `free_m` is what data workers may use
/// on each node beyond the workers already there.
fn two_jobs(free_m: [u64; 3]) -> (ClusterFacts, [(f64, f64); 2]) {
    let a = JobFacts {
        name: "ml/a".to_owned(),
        training_node: Some("gpu-a".to_owned()),
        training_gpus: 4,
        training_cpu_millicores: 4_000,
        pools: vec![pool(
            0,
            "a-stage-0",
            4_000,
            vec![pod("a-0-x1", Some("gpu-a"))],
        )],
        counters: None,
    };
    let b = JobFacts {
        name: "ml/b".to_owned(),
        training_node: Some("gpu-b".to_owned()),
        training_gpus: 1,
        training_cpu_millicores: 1_000,
        pools: vec![pool(
            0,
            "b-stage-0",
            2_000,
            vec![
                pod("b-0-x1", Some("gpu-b")),
                pod("b-0-x2", Some("gpu-b")),
                pod("b-0-x3", Some("gpu-b")),
            ],
        )],
        counters: None,
    };
    // Allocatable 64 CPUs; everything not free for data workers is other pods' requests
    // (the Lode workers already there are not "other").
    let facts = ClusterFacts {
        nodes: vec![
            node("gpu-a", 64_000, 64_000 - free_m[0] - 4_000, 8),
            node("gpu-b", 64_000, 64_000 - free_m[1] - 6_000, 8),
            node("cpu-1", 64_000, 64_000 - free_m[2], 0),
        ],
        jobs: vec![a, b],
    };
    (facts, [(25.0, 100.0), (100.0, 100.0)])
}

/// Reads the facts twice, 10 s apart, as two scheduler rounds would.
fn observe(
    facts: &ClusterFacts,
    rates: &[(f64, f64)],
) -> (ClusterView, ClusterFacts, ObservedSnapshot) {
    let mut view = ClusterView::new();
    let mut round = facts.clone();
    for (job, (rate, consume)) in round.jobs.iter_mut().zip(rates) {
        job.counters = Some(counters(job, 0.0, *rate, *consume));
    }
    let first = view.snapshot(&round);
    assert!(
        first.snapshot.jobs.is_empty(),
        "one reading measures nothing"
    );
    for (job, (rate, consume)) in round.jobs.iter_mut().zip(rates) {
        job.counters = Some(counters(job, 10.0, *rate, *consume));
    }
    let observed = view.snapshot(&round);
    (view, round, observed)
}

fn decided_count(observed: &ObservedSnapshot, decisions: &[Decision], job: JobId) -> u32 {
    let view = observed
        .snapshot
        .jobs
        .iter()
        .find(|j| j.id == job)
        .expect("measured");
    let adds = decisions
        .iter()
        .filter(|d| matches!(d, Decision::Add { job: j, .. } if *j == job))
        .count();
    let removes = decisions
        .iter()
        .filter(|d| matches!(d, Decision::Remove { job: j, .. } if *j == job))
        .count();
    u32::try_from(view.dw_count() as usize + adds - removes).expect("small")
}

#[test]
fn the_snapshot_counts_in_millicores_and_marks_cpu_only_nodes() {
    let (facts, rates) = two_jobs([8_000, 0, 16_000]);
    let (_, _, observed) = observe(&facts, &rates);
    let s = &observed.snapshot;
    assert_eq!(observed.nodes, ["cpu-1", "gpu-a", "gpu-b"]);
    let cpus: Vec<(u32, bool)> = s.machines.iter().map(|m| (m.dw_cpus, m.cpu_only)).collect();
    // Free capacity plus the Lode workers already there.
    assert_eq!(cpus, [(16_000, true), (12_000, false), (6_000, false)]);
    let a = &s.jobs[0];
    assert_eq!((a.dw_cpus, a.tw_cpus, a.gpus), (4_000, 4_000, 4));
    assert_eq!(a.tw_machines, [MachineId(1)]);
    assert!((a.gain_per_dw - 25.0).abs() < 0.5, "{a:?}");
    assert!((a.consumption - 100.0).abs() < 1.0, "{a:?}");
    assert_eq!(s.jobs[1].data_workers.get(&MachineId(2)), Some(&3));
}

#[test]
fn replicas_and_affinities_are_what_decide_chose_under_every_policy() {
    // Ample room, then tight room (the CPU-only node holds one 4-CPU worker, gpu-a none).
    for free in [[32_000, 8_000, 64_000], [0, 0, 4_000]] {
        let (facts, rates) = two_jobs(free);
        let (view, round, observed) = observe(&facts, &rates);
        let config = DecideConfig::default();
        for policy in Policy::ALL {
            let decisions = decide(policy, &observed.snapshot, &config);
            let p = plan(policy, &observed.snapshot, &config);
            assert_eq!(p.decisions, decisions);
            let k = view.plan_pools(&round, &observed, policy, &p);
            let t = target(policy, &observed.snapshot, &config);
            for (name, training) in [("ml/a", "gpu-a"), ("ml/b", "gpu-b")] {
                let id = observed.jobs[name];
                let pools: Vec<&PoolPlan> = k.pools.iter().filter(|p| p.job == name).collect();
                assert_eq!(pools.len(), 1);
                assert_eq!(
                    pools[0].replicas,
                    decided_count(&observed, &decisions, id),
                    "{policy:?} {free:?} {name}: {decisions:?}"
                );
                let mut want = vec![training.to_owned()];
                for m in &t.jobs[&id].order {
                    let n = observed.node(*m).expect("a node").to_owned();
                    if !want.contains(&n) {
                        want.push(n);
                    }
                }
                let got: Vec<String> = pools[0].affinity.iter().map(|t| t.node.clone()).collect();
                assert_eq!(got, want, "{policy:?} {free:?} {name}");
                // Every node decide adds a worker on is preferred.
                for d in &decisions {
                    if let Decision::Add { job, machine, .. }
                    | Decision::Migrate {
                        job, to: machine, ..
                    } = d
                    {
                        if *job == id {
                            assert!(got
                                .iter()
                                .any(|n| Some(n.as_str()) == observed.node(*machine)));
                        }
                    }
                }
                let weights: Vec<i32> = pools[0].affinity.iter().map(|t| t.weight).collect();
                assert_eq!(weights.first(), Some(&100));
                assert!(weights.windows(2).all(|w| w[0] > w[1] || w[1] == 1));
            }
        }
    }
}

#[test]
fn with_room_a_grows_to_four_and_b_drains_two_of_its_three() {
    let (facts, rates) = two_jobs([32_000, 8_000, 64_000]);
    let (view, round, observed) = observe(&facts, &rates);
    for policy in Policy::ALL {
        let p = plan(policy, &observed.snapshot, &DecideConfig::default());
        let k = view.plan_pools(&round, &observed, policy, &p);
        let a = k.pools.iter().find(|p| p.job == "ml/a").expect("a");
        let b = k.pools.iter().find(|p| p.job == "ml/b").expect("b");
        assert_eq!((a.active, a.replicas), (1, 4), "{policy:?}");
        assert!(a.drain.is_empty());
        assert_eq!((b.active, b.replicas), (3, 1), "{policy:?}");
        // The two drained are named with their dispatcher ids, and removed by the scale-in.
        let drained: Vec<(&str, Option<u64>, AfterDrain)> = b
            .drain
            .iter()
            .map(|d| (d.pod.as_str(), d.worker_id, d.then))
            .collect();
        assert_eq!(
            drained,
            [
                ("b-0-x1", Some(1), AfterDrain::ScaleIn),
                ("b-0-x2", Some(2), AfterDrain::ScaleIn)
            ]
        );
        let reasons: Vec<(&str, &str)> = k
            .events
            .iter()
            .map(|e| (e.job.as_str(), e.reason))
            .collect();
        assert_eq!(reasons, [("ml/a", "ScaledOut"), ("ml/b", "ScaledIn")]);
        let msg = &k.events[1].message;
        assert!(
            msg.starts_with(policy.name())
                && msg.contains("1 workers")
                && msg.contains("drain b-0-x1 on gpu-b"),
            "{msg}"
        );
    }
}

#[test]
fn a_worker_on_another_node_moves_home_by_drain_and_replace() {
    // Job a's one worker sits on the CPU-only node while its training node has room: MaxTP
    // moves it home; with Deployments that is a drain, then the pod's deletion.
    let (mut facts, rates) = two_jobs([32_000, 8_000, 64_000]);
    facts.jobs[0].pools[0].pods = vec![pod("a-0-x1", Some("cpu-1"))];
    facts.nodes[0].other_cpu_requests_millicores = 0;
    facts.nodes[2].other_cpu_requests_millicores = 64_000 - 4_000 - 4_000;
    let rates = [(25.0, 25.5), rates[1]];
    let (view, round, observed) = observe(&facts, &rates);
    let p = plan(Policy::MaxTp, &observed.snapshot, &DecideConfig::default());
    assert!(
        p.decisions
            .iter()
            .any(|d| matches!(d, Decision::Migrate { .. })),
        "{:?}",
        p.decisions
    );
    let k = view.plan_pools(&round, &observed, Policy::MaxTp, &p);
    let a = k.pools.iter().find(|p| p.job == "ml/a").expect("a");
    assert_eq!((a.active, a.replicas), (1, 1));
    assert_eq!(a.affinity[0].node, "gpu-a");
    assert_eq!(a.drain.len(), 1);
    assert_eq!(a.drain[0].then, AfterDrain::Replace);
    assert_eq!(a.drain[0].node.as_deref(), Some("cpu-1"));
    assert_eq!(k.events[0].reason, "Rebalanced");
}

#[test]
fn an_unmeasured_job_is_held_and_its_workers_keep_their_cpus() {
    let (mut facts, _) = two_jobs([0, 0, 8_000]);
    facts.jobs[1].pools[0].min_workers = 2;
    let mut view = ClusterView::new();
    let observed = view.snapshot(&facts);
    assert!(observed.snapshot.jobs.is_empty());
    // b's three workers are not planned, so their CPUs are not the policy's to give.
    let gpu_b = observed.machine("gpu-b").expect("node");
    assert_eq!(observed.snapshot.machines[gpu_b.0 as usize].dw_cpus, 0);
    let p = plan(Policy::Fair, &observed.snapshot, &DecideConfig::default());
    let k = view.plan_pools(&facts, &observed, Policy::Fair, &p);
    let counts: Vec<(u32, u32)> = k.pools.iter().map(|p| (p.active, p.replicas)).collect();
    assert_eq!(counts, [(1, 1), (3, 3)]);
    assert!(k.events.is_empty());
    // A job with no worker at all gets one, so that it can be measured.
    facts.jobs[0].pools[0].pods.clear();
    let observed = view.snapshot(&facts);
    let k = view.plan_pools(&facts, &observed, Policy::Fair, &p);
    assert_eq!((k.pools[0].active, k.pools[0].replicas), (0, 1));
    assert_eq!(k.events[0].reason, "Held");
}

#[test]
fn a_node_selector_keeps_data_workers_to_matching_nodes() {
    let (mut facts, rates) = two_jobs([32_000, 8_000, 64_000]);
    for n in &mut facts.nodes {
        if n.name != "gpu-b" {
            n.labels.insert("pool".to_owned(), "data".to_owned());
        }
    }
    let mut view =
        ClusterView::with_node_selector(BTreeMap::from([("pool".to_owned(), "data".to_owned())]));
    let mut round = facts.clone();
    for at in [0.0, 10.0] {
        for (job, (rate, consume)) in round.jobs.iter_mut().zip(&rates) {
            job.counters = Some(counters(job, at, *rate, *consume));
        }
        view.snapshot(&round);
    }
    let (observed, _, k) = view.round(&round, Policy::MaxTp, &DecideConfig::default());
    assert_eq!(observed.nodes, ["cpu-1", "gpu-a"]);
    // b's three workers sit on a node data workers may not use: they are planned away,
    // and b's one worker goes to a matching node.
    let b = k.pools.iter().find(|p| p.job == "ml/b").expect("b");
    assert_eq!((b.active, b.replicas, b.drain.len()), (3, 1, 2));
    assert!(
        b.affinity.iter().skip(1).all(|t| t.node != "gpu-b"),
        "{b:?}"
    );
}

#[test]
fn stages_are_split_so_the_slowest_stage_is_fed() {
    // Stage 0 makes 30 steps/s per worker, stage 1 10: three stage-1 workers per stage-0.
    assert_eq!(split_by_stage(8, &[30.0, 10.0]), [2, 6]);
    assert_eq!(split_by_stage(1, &[30.0, 10.0]), [1, 0]);
    assert_eq!(split_by_stage(2, &[30.0, 10.0]), [1, 1]);
    assert_eq!(split_by_stage(0, &[5.0]), [0]);
    assert!(split_by_stage(3, &[]).is_empty());
}

#[test]
fn status_answers_become_counters() {
    let status = v1::StatusResponse {
        steps_consumed: 7,
        steps_computed: 9,
        compute_us: 11,
        consumer_busy_us: 13,
        steps_per_epoch: 100,
        epochs: 2,
        workers: vec![v1::WorkerEntry {
            id: 4,
            stage: 1,
            status: v1::WorkerStatus::Draining as i32,
            name: "p".to_owned(),
            steps_computed: 3,
            compute_us: 5,
            ..Default::default()
        }],
        ..Default::default()
    };
    let c = DispatcherCounters::from_status(&status, 2.5);
    assert_eq!(c.remaining_steps(), Some(193));
    assert_eq!(
        c.workers,
        [DispatcherWorker {
            id: 4,
            name: "p".to_owned(),
            stage: 1,
            draining: true,
            steps_computed: 3,
            compute_us: 5
        }]
    );
    assert_eq!((c.at_s, c.steps_computed, c.consumer_busy_us), (2.5, 9, 13));
}

#[test]
fn long_event_messages_are_cut_at_a_character_boundary() {
    let m = truncate("é".repeat(MAX_EVENT_MESSAGE_BYTES));
    assert!(m.len() <= MAX_EVENT_MESSAGE_BYTES && m.ends_with("..."));
}

mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    struct ArbPool {
        cpu_m: u64,
        min: u32,
        max: u32,
        /// Node index per pod (`None`: Pending), and whether it is terminating.
        pods: Vec<(Option<usize>, bool)>,
    }

    fn arb_pool() -> impl Strategy<Value = ArbPool> {
        (
            1u64..16,
            0u32..3,
            0u32..7,
            proptest::collection::vec(
                (
                    proptest::option::weighted(0.85, 0usize..4),
                    proptest::bool::weighted(0.1),
                ),
                0..6,
            ),
        )
            .prop_map(|(cpu, min, max, pods)| ArbPool {
                cpu_m: cpu * 500,
                min,
                max,
                pods,
            })
    }

    fn arb_job() -> impl Strategy<Value = (Vec<ArbPool>, usize, f64, f64)> {
        (
            proptest::collection::vec(arb_pool(), 1..3),
            0usize..4,
            1.0f64..200.0,
            1.0f64..500.0,
        )
    }

    fn build(
        nodes: &[(u64, u64, bool, bool)],
        jobs: &[(Vec<ArbPool>, usize, f64, f64)],
    ) -> ClusterFacts {
        let names: Vec<String> = (0..nodes.len()).map(|i| format!("n{i}")).collect();
        ClusterFacts {
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(i, &(alloc, other, gpu, ok))| NodeFacts {
                    schedulable: ok,
                    ..node(
                        &names[i],
                        alloc * 1_000,
                        (other * 1_000).min(alloc * 1_000),
                        if gpu { 8 } else { 0 },
                    )
                })
                .collect(),
            jobs: jobs
                .iter()
                .enumerate()
                .map(|(j, (pools, tn, _, _))| JobFacts {
                    name: format!("ns/j{j}"),
                    training_node: names.get(*tn).cloned(),
                    training_gpus: 1,
                    training_cpu_millicores: 1_000,
                    pools: pools
                        .iter()
                        .enumerate()
                        .map(|(s, p)| PoolFacts {
                            min_workers: p.min,
                            max_workers: p.max,
                            pods: p
                                .pods
                                .iter()
                                .enumerate()
                                .map(|(k, (n, term))| WorkerPodFacts {
                                    name: format!("j{j}-s{s}-{k}"),
                                    node: n.and_then(|n| names.get(n).cloned()),
                                    terminating: *term,
                                })
                                .collect(),
                            ..pool(
                                u32::try_from(s).unwrap_or(0),
                                &format!("j{j}-s{s}"),
                                p.cpu_m,
                                Vec::new(),
                            )
                        })
                        .collect(),
                    counters: None,
                })
                .collect(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Whatever the cluster: a pool shrinks below its active pods only with exactly
        /// that many of them named to drain first; no pod is named twice or drained when it
        /// is not active; replicas respect the pool's bounds; and a measured job's pools
        /// without bounds add up to what decide gives it.
        #[test]
        fn a_scale_in_names_its_pods_first_and_counts_follow_decide(
            nodes in proptest::collection::vec((1u64..64, 0u64..64, any::<bool>(), proptest::bool::weighted(0.9)), 1..5),
            jobs in proptest::collection::vec(arb_job(), 1..4),
            p in 0usize..3,
        ) {
            let policy = Policy::ALL[p];
            let facts = build(&nodes, &jobs);
            let rates: Vec<(f64, f64)> = jobs.iter().map(|j| (j.2, j.3)).collect();
            let mut view = ClusterView::new();
            let mut round = facts.clone();
            for (job, (rate, consume)) in round.jobs.iter_mut().zip(&rates) {
                job.counters = Some(counters(job, 0.0, *rate, *consume));
            }
            view.snapshot(&round);
            for (job, (rate, consume)) in round.jobs.iter_mut().zip(&rates) {
                job.counters = Some(counters(job, 10.0, *rate, *consume));
            }
            let observed = view.snapshot(&round);
            let plan = plan(policy, &observed.snapshot, &DecideConfig::default());
            let k = view.plan_pools(&round, &observed, policy, &plan);
            let mut named = BTreeSet::new();
            for (job, facts_job) in jobs.iter().zip(&round.jobs) {
                let pools: Vec<&PoolPlan> = k.pools.iter().filter(|p| p.job == facts_job.name).collect();
                prop_assert_eq!(pools.len(), facts_job.pools.len());
                for (pp, pf) in pools.iter().zip(&facts_job.pools) {
                    let active: BTreeSet<&str> = active_pods(pf, facts_job.counters.as_ref())
                        .iter().map(|p| p.name.as_str()).collect();
                    prop_assert_eq!(pp.active as usize, active.len());
                    let scale_in = pp.drain.iter().filter(|d| d.then == AfterDrain::ScaleIn).count();
                    prop_assert_eq!(scale_in, pp.active.saturating_sub(pp.replicas) as usize, "{:?}", pp);
                    for d in &pp.drain {
                        prop_assert!(active.contains(d.pod.as_str()), "{:?}", d);
                        prop_assert!(named.insert(d.pod.clone()), "named twice: {:?}", d);
                    }
                    prop_assert!(pp.replicas >= pf.min_workers);
                    if pf.max_workers >= pf.min_workers && pf.max_workers > 0 {
                        prop_assert!(pp.replicas <= pf.max_workers);
                    }
                }
                let id = observed.jobs[&facts_job.name];
                let unbounded = job.0.iter().all(|p| p.min == 0 && p.max == 0);
                if unbounded && observed.snapshot.jobs.iter().any(|j| j.id == id) {
                    let total: u32 = pools.iter().map(|p| p.replicas).sum();
                    prop_assert_eq!(total, decided_count(&observed, &plan.decisions, id));
                }
            }
        }
    }
}
