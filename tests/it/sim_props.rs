//! Property tests for the twin's request parsers: arbitrary bytes and arbitrary JSON/YAML
//! sent to the Kubernetes API (object and patch bodies, the fault endpoint), the GitHub
//! emulator, the `--config` parser and the Talos machine-config parser never panic, never
//! answer 5xx, and garbage gets an error. Case counts are small so this runs in seconds.

use std::sync::OnceLock;

use ichor::clock::Clock;
use ichor::sim::faults::FaultTargets;
use ichor::sim::github::{GithubTwin, RepoSpec};
use ichor::sim::kube::patch::{json_patch, merge_patch, strategic_merge_patch};
use ichor::sim::kube::{Behaviour, KubeSeed, KubeTwin};
use ichor::sim::talos::MachineConfig;
use ichor::sim::twin::TwinConfig;
use proptest::prelude::*;
use serde_json::Value;

use crate::sim_wire::Wire;

/// One runtime for every case, so the twins started in it keep running between cases.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
}

struct Kube {
    _twin: KubeTwin,
    wire: Wire,
    _dir: tempfile::TempDir,
}

fn kube_twin() -> Kube {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let twin = KubeTwin::start_with(
            Clock::manual(),
            KubeSeed::typical(1, 2),
            Behaviour::default(),
            dir.path(),
        )
        .await
        .expect("kube twin");
        let wire = Wire::kube(&twin).expect("client");
        Kube {
            _twin: twin,
            wire,
            _dir: dir,
        }
    })
}

/// The twin the body properties write to.
fn kube() -> &'static Kube {
    static K: OnceLock<Kube> = OnceLock::new();
    K.get_or_init(kube_twin)
}

/// A twin of its own for the fault endpoint, so an accepted fault cannot fail the others.
fn kube_for_faults() -> &'static Kube {
    static K: OnceLock<Kube> = OnceLock::new();
    K.get_or_init(kube_twin)
}

struct Github {
    _twin: GithubTwin,
    wire: Wire,
    _dir: tempfile::TempDir,
}

fn github() -> &'static Github {
    static G: OnceLock<Github> = OnceLock::new();
    G.get_or_init(|| {
        runtime().block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let repo = dir.path().join("homelab");
            ichor::sim::fixture::Fixture::homelab()
                .build(&repo)
                .expect("fixture");
            let twin = GithubTwin::start(
                Clock::manual(),
                vec![RepoSpec::new("local/homelab", &repo)],
                None,
            )
            .await
            .expect("github twin");
            let wire = Wire::github(&twin);
            Github {
                _twin: twin,
                wire,
                _dir: dir,
            }
        })
    })
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(Value::from),
        "[a-z0-9/~._:-]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z$/~._-]{0,10}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON patch operations that look like real ones: known and unknown ops, real paths.
fn json_patch_ops() -> impl Strategy<Value = Value> {
    let op = prop_oneof![
        Just("add"),
        Just("remove"),
        Just("replace"),
        Just("move"),
        Just("copy"),
        Just("test"),
        Just("nope"),
    ];
    let pointer = prop_oneof![
        Just(String::new()),
        Just("/metadata".to_string()),
        Just("/metadata/labels".to_string()),
        Just("/metadata/labels/a".to_string()),
        Just("/spec".to_string()),
        Just("/spec/taints/-".to_string()),
        Just("/spec/taints/0".to_string()),
        "(/[a-z0-9~-]{0,4}){0,4}",
    ];
    prop::collection::vec(
        (op, pointer.clone(), pointer, json_value()).prop_map(|(op, path, from, value)| {
            serde_json::json!({"op": op, "path": path, "from": from, "value": value})
        }),
        0..8,
    )
    .prop_map(Value::Array)
}

/// YAML-looking text with anchors, aliases, tags, flow and block syntax mixed at random.
fn yamlish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            "[a-zA-Z0-9 ]{0,8}",
            Just(": ".to_string()),
            Just("\n".to_string()),
            Just("\n  ".to_string()),
            Just("- ".to_string()),
            Just("&a ".to_string()),
            Just("*a".to_string()),
            Just("&b [*a, *a, *a]".to_string()),
            Just("!tag ".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(", ".to_string()),
            Just("---\n".to_string()),
            Just("\"q\\u00e9\"".to_string()),
            Just("faults:\n  ".to_string()),
            Just("version: v1alpha1\n".to_string()),
            Just("<<: *a\n".to_string()),
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

/// The Kubernetes API's answer to `body` at each body-taking route (every route gets it).
fn kube_answers(content_type: &str, body: &[u8]) -> Vec<(String, u16)> {
    let k = kube();
    let routes = [
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            content_type,
        ),
        ("PUT", "/api/v1/nodes/worker-1", content_type),
        (
            "PATCH",
            "/api/v1/nodes/worker-1",
            "application/merge-patch+json",
        ),
        (
            "PATCH",
            "/api/v1/nodes/worker-1",
            "application/strategic-merge-patch+json",
        ),
        (
            "PATCH",
            "/api/v1/nodes/worker-1",
            "application/json-patch+json",
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/configmaps/prop?fieldManager=p",
            "application/apply-patch+yaml",
        ),
        (
            "POST",
            "/api/v1/namespaces/kube-system/pods/nope/eviction",
            content_type,
        ),
        (
            "DELETE",
            "/api/v1/namespaces/default/configmaps/nope",
            content_type,
        ),
    ];
    runtime().block_on(async {
        let mut out = Vec::new();
        for (method, path, ct) in routes {
            let r = k
                .wire
                .send(method, path, Some(ct), body.to_vec())
                .await
                .expect("the twin answers");
            out.push((format!("{method} {path} ({ct})"), r.code));
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn kube_bodies_of_arbitrary_bytes_never_get_5xx(body in prop::collection::vec(any::<u8>(), 0..256)) {
        let object = serde_json::from_slice::<Value>(&body).is_ok_and(|v| v.is_object());
        for (route, code) in kube_answers("application/json", &body) {
            prop_assert!(code < 500, "{} answered {}", route, code);
            if !object && !route.starts_with("DELETE") && !route.contains("apply-patch") {
                prop_assert!(code >= 400, "{} accepted garbage with {}", route, code);
            }
        }
    }

    #[test]
    fn kube_bodies_of_arbitrary_json_never_get_5xx(v in json_value()) {
        for (route, code) in kube_answers("application/json", v.to_string().as_bytes()) {
            prop_assert!(code < 500, "{} answered {} for {}", route, code, v);
        }
    }

    #[test]
    fn kube_bodies_of_arbitrary_yaml_never_get_5xx(text in yamlish()) {
        for (route, code) in kube_answers("application/yaml", text.as_bytes()) {
            prop_assert!(code < 500, "{} answered {} for {:?}", route, code, text);
        }
    }

    #[test]
    fn the_fault_endpoint_answers_200_400_or_422(
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..128),
            json_value().prop_map(|v| v.to_string().into_bytes()),
        ]
    ) {
        let k = kube_for_faults();
        let code = runtime()
            .block_on(k.wire.send("POST", "/_twin/faults", Some("application/json"), body.clone()))
            .map(|r| r.code)
            .unwrap_or(0);
        prop_assert!(matches!(code, 200 | 400 | 422), "{} for {:?}", code, String::from_utf8_lossy(&body));
        if serde_json::from_slice::<Value>(&body).is_err() {
            prop_assert_eq!(code, 400);
        }
        // Whatever it was, the API still serves (no burst was injected by garbage).
        let nodes = runtime().block_on(k.wire.send("GET", "/api/v1/nodes", None, vec![])).map(|r| r.code).unwrap_or(0);
        prop_assert_eq!(nodes, 200);
    }

    #[test]
    fn github_bodies_never_get_5xx(
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..128),
            json_value().prop_map(|v| v.to_string().into_bytes()),
        ]
    ) {
        let g = github();
        let routes = [
            ("POST", "/repos/local/homelab/pulls"),
            ("PUT", "/repos/local/homelab/pulls/1/merge"),
            ("POST", "/repos/local/homelab/statuses/0000000000000000000000000000000000000000"),
            ("POST", "/repos/local/homelab/issues/1/comments"),
            ("PATCH", "/repos/local/homelab/issues/comments/1"),
        ];
        for (method, path) in routes {
            let code = runtime()
                .block_on(g.wire.send(method, path, Some("application/json"), body.clone()))
                .map(|r| r.code)
                .unwrap_or(0);
            prop_assert!((200..500).contains(&code), "{} {} answered {}", method, path, code);
            if serde_json::from_slice::<Value>(&body).is_err() && !(method == "PUT" && body.is_empty()) {
                prop_assert!(code >= 400, "{} {} accepted garbage with {}", method, path, code);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_config_parser_and_validator_never_panic(text in prop_oneof![yamlish(), any::<String>()]) {
        if let Ok(config) = TwinConfig::parse("twin.yaml", &text) {
            let targets = FaultTargets {
                nodes: Some(["cp-1".to_string()].into()),
                control_planes: ["cp-1".to_string()].into(),
                volumes: ["pvc-data".to_string()].into(),
                pdbs: ["default/web".to_string()].into(),
                github: false,
            };
            let _ = config.validate(&targets);
        }
    }

    #[test]
    fn the_machine_config_parser_refuses_garbage(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        text in yamlish(),
    ) {
        prop_assert!(MachineConfig::parse(&bytes, "v1.13.2").is_err());
        let _ = MachineConfig::parse(text.as_bytes(), "v1.13.2");
    }

    #[test]
    fn patches_never_panic(target in json_value(), patch in json_value(), ops in json_patch_ops()) {
        let mut t = target.clone();
        merge_patch(&mut t, &patch);
        let mut t = target.clone();
        let _ = strategic_merge_patch(&mut t, &patch);
        let mut t = target.clone();
        let _ = json_patch(&mut t, &ops);
        let mut t = target;
        let _ = json_patch(&mut t, &patch);
    }

    #[test]
    fn the_yaml_bound_never_panics(text in yamlish()) {
        let _ = ichor::sim::yaml::check(&text);
    }
}
