//! BEV label grids on the CPU: cell layout, the confidence-weighted vote, occupancy, bad input.

use sptr::ops::label_grid::cpu::{label_grid_cpu, BevGridParams, NO_DATA};

fn params() -> BevGridParams {
    BevGridParams {
        range: [-2.0, -1.0, 2.0, 1.0],
        resolution: 0.5,
        classes: 4,
        obstacle_classes: vec![0, 2],
        palette: vec![[10, 0, 0], [0, 20, 0], [0, 0, 30], [40, 40, 40]],
    }
}

#[test]
fn grid_shape_and_cell_layout() {
    let p = params();
    assert_eq!((p.width(), p.height()), (8, 4));
    // One point in cell (ix=5, iy=2): x in [0.5, 1.0), y in [0.0, 0.5).
    let g = label_grid_cpu(&[0.7], &[0.1], &[3], &[0.9], &p).unwrap();
    let idx = 2 * 8 + 5;
    for (i, &l) in g.labels.iter().enumerate() {
        assert_eq!(l, if i == idx { 3 } else { NO_DATA }, "cell {i}");
    }
    assert_eq!(&g.rgb[idx * 3..idx * 3 + 3], &[40, 40, 40]);
    assert_eq!(g.occupancy[idx], 0, "class 3 is not an obstacle");
    assert_eq!(g.occupancy.iter().filter(|&&o| o == -1).count(), 31, "empty cells are unknown");
    assert!(g.rgb.iter().enumerate().all(|(i, &v)| i / 3 == idx || v == 0));
}

#[test]
fn confident_points_outvote_uncertain_ones_and_count_beats_a_single_outlier() {
    let p = params();
    // Cell (0, 0): three uncertain class-1 points vs two confident class-2 points.
    // weights: 3 * (1 + round(0.2 * 65535)) = 39324 vs 2 * (1 + 65535) = 131072 -> class 2.
    let g = label_grid_cpu(&[-1.9; 5], &[-0.9; 5], &[1, 1, 1, 2, 2], &[0.2, 0.2, 0.2, 1.0, 1.0], &p).unwrap();
    assert_eq!(g.labels[0], 2);
    // occupancy = round(100 * 131072 / (131072 + 39324)) = 77
    assert_eq!(g.occupancy[0], 77);
    // Ten 0.6-confident class-1 points vs one 1.0 class-0 outlier: the majority wins.
    let mut cls = vec![1u8; 10];
    cls.push(0);
    let mut pr = vec![0.6f32; 10];
    pr.push(1.0);
    let g = label_grid_cpu(&[-1.9; 11], &[-0.9; 11], &cls, &pr, &p).unwrap();
    assert_eq!(g.labels[0], 1);
    assert_eq!(g.occupancy[0], 14, "round(100 * 65536 / (65536 + 10 * 39322)) = round(14.29)");
}

#[test]
fn ties_go_to_the_lowest_class_and_zero_probability_still_votes() {
    let p = params();
    let g = label_grid_cpu(&[0.1, 0.1], &[0.1, 0.1], &[3, 1], &[0.0, 0.0], &p).unwrap();
    let idx = 2 * 8 + 4;
    assert_eq!(g.labels[idx], 1);
    assert_eq!(g.occupancy[idx], 0);
}

#[test]
fn outside_points_bad_classes_and_non_finite_are_ignored() {
    let p = params();
    let x = [2.0, -2.01, 0.0, f32::NAN, 0.0, 0.0];
    let y = [0.0, 0.0, 1.0, 0.0, f32::INFINITY, 0.0];
    let c = [0, 0, 0, 0, 0, 4]; // the last is a class id >= classes
    let g = label_grid_cpu(&x, &y, &c, &[1.0; 6], &p).unwrap();
    assert!(g.labels.iter().all(|&l| l == NO_DATA));
    // NaN probability counts as 0 (weight 1); > 1 clamps to 1.
    let g = label_grid_cpu(&[0.0, 0.0, 0.0], &[0.0, 0.0, 0.0], &[1, 1, 2], &[f32::NAN, f32::NAN, 7.0], &p).unwrap();
    assert_eq!(g.labels[2 * 8 + 4], 2);
}

#[test]
fn empty_input_gives_an_all_unknown_grid() {
    let g = label_grid_cpu(&[], &[], &[], &[], &params()).unwrap();
    assert!(g.labels.iter().all(|&l| l == NO_DATA) && g.occupancy.iter().all(|&o| o == -1));
    assert_eq!(g.labels.len(), 32);
}

#[test]
fn bad_parameters_and_lengths_are_errors() {
    let mut p = params();
    p.resolution = 0.0;
    assert!(label_grid_cpu(&[], &[], &[], &[], &p).is_err());
    let mut p = params();
    p.range = [1.0, 0.0, 0.0, 1.0];
    assert!(label_grid_cpu(&[], &[], &[], &[], &p).is_err());
    let mut p = params();
    p.obstacle_classes = vec![4];
    assert!(label_grid_cpu(&[], &[], &[], &[], &p).is_err());
    let mut p = params();
    p.palette.pop();
    assert!(label_grid_cpu(&[], &[], &[], &[], &p).is_err());
    let mut p = params();
    p.resolution = 1e-4;
    assert!(label_grid_cpu(&[], &[], &[], &[], &p).unwrap_err().to_string().contains("16 million"));
    let e = label_grid_cpu(&[0.0], &[0.0, 1.0], &[0], &[1.0], &params()).unwrap_err();
    assert!(e.to_string().contains("lengths differ"), "{e}");
}
