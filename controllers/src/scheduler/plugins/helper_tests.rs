//! Named cases for the score normalization.

use super::*;

#[test]
fn default_normalization_scales_and_reverses() {
    let scores = |v: &[i64]| -> Vec<NodeScore> {
        v.iter()
            .enumerate()
            .map(|(i, &s)| NodeScore {
                name: format!("n{i}"),
                score: s,
            })
            .collect()
    };
    let cases: Vec<(&str, Vec<i64>, bool, Vec<i64>)> = vec![
        (
            "scaled to the max",
            vec![1, 2, 3, 4, 5],
            false,
            vec![20, 40, 60, 80, 100],
        ),
        (
            "reversed",
            vec![1, 2, 3, 4, 5],
            true,
            vec![80, 60, 40, 20, 0],
        ),
        ("all zero stays zero", vec![0, 0, 0], false, vec![0, 0, 0]),
        (
            "all zero reversed is max",
            vec![0, 0, 0],
            true,
            vec![100, 100, 100],
        ),
        (
            "truncates",
            vec![1000, 10, 20, 30],
            false,
            vec![100, 1, 2, 3],
        ),
        ("no nodes", vec![], true, vec![]),
    ];
    for (name, input, reverse, want) in cases {
        let mut s = scores(&input);
        default_normalize_score(100, reverse, &mut s);
        assert_eq!(
            s.iter().map(|s| s.score).collect::<Vec<_>>(),
            want,
            "{name}"
        );
    }
}
