//! Worker batches: at most `max_unavailable` nodes each, and never two nodes that hold
//! replicas of the same volume. Minimising the number of batches is graph colouring with a
//! capacity, so this is a greedy first-fit over nodes ordered by how constrained they are,
//! reported next to a lower bound so a reader can see how close it came.

use std::collections::HashMap;

use serde::Serialize;

/// A node to place: its name and the volumes it holds a replica of.
#[derive(Debug, Clone)]
pub struct Placeable<'a> {
    pub name: &'a str,
    pub volumes: &'a [String],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Batches {
    pub batches: Vec<Vec<String>>,
    /// No arrangement can use fewer batches than this.
    pub lower_bound: usize,
}

/// Split `nodes` into batches. `last`, if present among the nodes, is the final batch on
/// its own: the node running ichor goes once every other worker is done (its drain moves
/// ichor itself, so nothing else may be under way then; `rollout/pool.rs`), which is a
/// round of its own in any arrangement, and the lower bound counts it.
pub fn plan_batches(nodes: &[Placeable], max_unavailable: usize, last: Option<&str>) -> Batches {
    if let Some(me) = last.filter(|me| nodes.len() > 1 && nodes.iter().any(|n| n.name == *me)) {
        let others: Vec<Placeable> = nodes.iter().filter(|n| n.name != me).cloned().collect();
        let mut b = plan_batches(&others, max_unavailable, None);
        b.batches.push(vec![me.to_string()]);
        b.lower_bound += 1;
        return b;
    }
    let k = max_unavailable.max(1);
    if nodes.is_empty() {
        return Batches {
            batches: vec![],
            lower_bound: 0,
        };
    }
    // Volume names → dense ids, and each node's volume ids.
    let mut ids: HashMap<&str, u32> = HashMap::new();
    let node_vols: Vec<Vec<u32>> = nodes
        .iter()
        .map(|n| {
            let mut v: Vec<u32> = n
                .volumes
                .iter()
                .map(|vol| {
                    let next = ids.len() as u32;
                    *ids.entry(vol.as_str()).or_insert(next)
                })
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let mut holders = vec![0usize; ids.len()];
    for vols in &node_vols {
        for &v in vols {
            holders[v as usize] += 1;
        }
    }
    // Nodes holding replicas of one volume form a clique: each needs its own batch.
    let clique = holders.iter().copied().max().unwrap_or(1).max(1);
    let lower_bound = nodes.len().div_ceil(k).max(clique);

    // Most constrained first: the nodes whose volumes have the most holders, then by name
    // for a stable order.
    let weight: Vec<usize> = node_vols
        .iter()
        .map(|vols| vols.iter().map(|&v| holders[v as usize] - 1).sum())
        .collect();
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| {
        weight[b]
            .cmp(&weight[a])
            .then(nodes[a].name.cmp(nodes[b].name))
    });

    struct Open {
        members: Vec<usize>,
        /// Sorted volume ids already in the batch.
        vols: std::collections::HashSet<u32>,
    }
    let mut batches: Vec<Open> = Vec::new();
    // Indices of batches that still have room, so full batches cost nothing to skip.
    let mut open: Vec<usize> = Vec::new();
    for &i in &order {
        let vols = &node_vols[i];
        let slot = open
            .iter()
            .position(|&b| vols.iter().all(|v| !batches[b].vols.contains(v)));
        let b = match slot {
            Some(pos) => open[pos],
            None => {
                batches.push(Open {
                    members: Vec::new(),
                    vols: Default::default(),
                });
                open.push(batches.len() - 1);
                batches.len() - 1
            }
        };
        batches[b].members.push(i);
        batches[b].vols.extend(vols.iter().copied());
        if batches[b].members.len() >= k {
            open.retain(|&x| x != b);
        }
    }
    let mut out: Vec<Vec<String>> = batches
        .into_iter()
        .map(|b| {
            let mut names: Vec<String> = b
                .members
                .iter()
                .map(|&i| nodes[i].name.to_string())
                .collect();
            names.sort();
            names
        })
        .collect();
    // The batches short of `k` first: first-fit leaves at its end the nodes that share a
    // volume with each other, one short batch each. The rollout starts workers in the
    // plan's order as slots free, so at the end they would each go alone, one after the
    // other, with every other slot idle; first, the rest of the queue fills around them.
    out.sort_by_key(|b| b.len() >= k);
    Batches {
        batches: out,
        lower_bound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(spec: &[(&'static str, &[&str])]) -> Vec<(String, Vec<String>)> {
        spec.iter()
            .map(|(n, v)| (n.to_string(), v.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    fn place(owned: &[(String, Vec<String>)]) -> Vec<Placeable<'_>> {
        owned
            .iter()
            .map(|(n, v)| Placeable {
                name: n,
                volumes: v,
            })
            .collect()
    }

    #[test]
    fn three_replica_volume_needs_three_batches() {
        let owned = nodes(&[("w-1", &["a"]), ("w-2", &["a"]), ("w-3", &["a"])]);
        let b = plan_batches(&place(&owned), 3, None);
        assert_eq!(b.batches.len(), 3);
        assert_eq!(b.lower_bound, 3);
    }

    #[test]
    fn unrelated_nodes_fill_batches_up_to_max_unavailable() {
        let owned = nodes(&[
            ("w-1", &["a"]),
            ("w-2", &["b"]),
            ("w-3", &["c"]),
            ("w-4", &[]),
            ("w-5", &[]),
        ]);
        let b = plan_batches(&place(&owned), 2, None);
        assert_eq!(b.batches.len(), 3);
        assert!(b.batches.iter().all(|x| x.len() <= 2));
        assert_eq!(b.lower_bound, 3);
    }

    #[test]
    fn short_batches_go_first_so_the_queue_fills_around_them() {
        let owned = nodes(&[
            ("w-1", &[]),
            ("w-2", &[]),
            ("w-3", &[]),
            ("w-5", &["v"]),
            ("w-6", &["v"]),
        ]);
        let b = plan_batches(&place(&owned), 3, None);
        assert_eq!(b.batches, [vec!["w-3", "w-6"], vec!["w-1", "w-2", "w-5"]]);
        // The node running ichor stays last, on its own.
        let b = plan_batches(&place(&owned), 3, Some("w-1"));
        assert_eq!(
            b.batches.last().map(Vec::as_slice),
            Some(&["w-1".to_string()][..])
        );
        assert!(b.batches[0].len() < 3);
    }

    #[test]
    fn the_named_node_goes_last() {
        let owned = nodes(&[("w-1", &[]), ("w-2", &[]), ("w-3", &[])]);
        let b = plan_batches(&place(&owned), 1, Some("w-1"));
        assert_eq!(b.batches.last().unwrap(), &vec!["w-1".to_string()]);
    }

    #[test]
    fn the_named_node_is_a_round_of_its_own_and_the_bound_counts_it() {
        let owned = nodes(&[
            ("w-1", &[]),
            ("w-2", &[]),
            ("w-3", &[]),
            ("w-4", &[]),
            ("w-5", &[]),
            ("w-6", &[]),
        ]);
        let b = plan_batches(&place(&owned), 5, Some("w-3"));
        assert_eq!(b.batches.len(), 2);
        assert_eq!(b.batches[0], ["w-1", "w-2", "w-4", "w-5", "w-6"]);
        assert_eq!(b.batches[1], ["w-3"]);
        // Six nodes fit two batches of five, but the last one must go alone after the
        // other five: no arrangement uses fewer than two rounds, and two is what it takes.
        assert_eq!(b.lower_bound, 2);
        let b = plan_batches(&place(&owned[..5]), 5, Some("w-3"));
        assert_eq!((b.batches.len(), b.lower_bound), (2, 2));
        // Alone, it is simply the one batch.
        let b = plan_batches(&place(&owned[..1]), 5, Some("w-1"));
        assert_eq!((b.batches.len(), b.lower_bound), (1, 1));
    }
}
