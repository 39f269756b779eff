//! README says what the scripts and the build do (a new user following it must not hit
//! paths, features and figures that do not hold). Each check reads README.md and the file it
//! describes.

mod common;

fn read(rel: &str) -> String {
    std::fs::read_to_string(common::root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// README.md and every page of docs/ (README is the newcomer's page; the detail is in docs/),
/// one after another.
fn docs() -> String {
    let mut pages: Vec<std::path::PathBuf> = std::fs::read_dir(common::root().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    let mut all = read("README.md");
    for p in pages {
        all.push_str("\n\n");
        all.push_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display())));
    }
    all
}

/// Lines of README's shell code blocks.
fn code_lines(readme: &str) -> Vec<&str> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside && line.trim_start() == "```bash";
            continue;
        }
        if inside {
            out.push(line);
        }
    }
    out
}

/// One binary path that works: the two commands build into `$SPTR_CACHE/target`
/// (`~/.cache/sptr/target`), README says so, and no example runs a `target/release/...` path the
/// two commands never create.
#[test]
fn binaries_are_where_readme_says() {
    let readme = docs();
    for script in ["scripts/run_sample.sh", "scripts/test.sh"] {
        let s = read(script);
        assert!(s.contains(r#"SPTR_CACHE="${SPTR_CACHE:-$HOME/.cache/sptr}""#), "{script}: the cache root changed");
        assert!(s.contains(r#"CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SPTR_CACHE/target}""#), "{script}: the build directory changed");
    }
    assert!(read("scripts/run_sample.sh").contains("$CARGO_TARGET_DIR/release/sptr"), "run_sample.sh prints where sptr is");
    assert!(readme.contains("~/.cache/sptr/target/release"), "README names the build directory");
    for (i, line) in readme.lines().enumerate() {
        for (k, _) in line.match_indices("target/release/") {
            assert!(
                line[..k].ends_with("~/.cache/sptr/") || line[..k].ends_with("$CARGO_TARGET_DIR/"),
                "README line {}: a target/release path the two commands do not create: {line}",
                i + 1
            );
        }
    }
}

/// The node's documented builds have the CUDA feature its default `device: cuda` needs, and the
/// ROS tests build it that way.
#[test]
fn node_builds_have_the_cuda_feature_its_default_device_needs() {
    let readme = docs();
    let params = read("config/perception.yaml");
    assert!(params.contains("device: cuda"), "the node's default device changed: revisit README's build lines");
    let builds: Vec<&str> = code_lines(&readme).into_iter().filter(|l| l.contains("--features ros")).collect();
    assert!(builds.len() >= 3, "README's node build lines: {builds:?}");
    for l in builds {
        assert!(
            l.contains("--features ros,cuda") || l.contains("--features ros --features cuda"),
            "README builds the node without cuda: {l}"
        );
        // cargo-ament-build reads a comma list as one feature name and then installs no node
        assert!(!(l.contains("colcon build") && l.contains("ros,cuda")), "colcon needs two --features flags: {l}");
    }
    let test_ros = read("scripts/test_ros.sh");
    assert!(test_ros.contains("features=ros,cuda"), "scripts/test_ros.sh tests another build");
    assert!(test_ros.contains("--cargo-args --release --features ros --features cuda"), "scripts/test_ros.sh installs another build");
}

/// The PyPI wheels are Kilted; the script exports ROS_DISTRO=rolling because of r2r's version;
/// README and the script say so, for the r2r the lock file pins.
#[test]
fn ros_distro_rolling_is_explained() {
    let lock = read("Cargo.lock");
    let r2r = lock.split("[[package]]").find(|p| p.contains("name = \"r2r\"\n")).expect("r2r in Cargo.lock");
    assert!(r2r.contains("version = \"0.9.7\""), "r2r changed: does it know kilted now? Revisit ROS_DISTRO in scripts/ros_env.sh and README");
    let env = read("scripts/ros_env.sh");
    assert!(env.contains("ROS_DISTRO) value=rolling"), "scripts/ros_env.sh exports another ROS_DISTRO");
    assert!(env.contains("Kilted") && env.contains("r2r 0.9.7"), "scripts/ros_env.sh does not say why");
    let readme = docs();
    // the paragraph of README that explains it (line breaks read as spaces)
    let para = readme
        .split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .find(|p| p.contains("exports `ROS_DISTRO=rolling`"))
        .expect("a README paragraph on why scripts/ros_env.sh exports ROS_DISTRO=rolling");
    for w in ["Kilted", "r2r 0.9.7", "`kilted`", "ros-rclpy"] {
        assert!(para.contains(w), "README's ROS_DISTRO paragraph does not say `{w}`:\n{para}");
    }
}

/// Speed figures are the spread of repeated runs' medians (measured: 7.1-7.9 ms and
/// 18.0-19.2 ms on the H100), not a best run; test-time figures are what a new machine sees.
#[test]
fn figures_are_measured_ranges() {
    let readme = docs();
    for best in ["6.2 ms for the", "17.5 ms for a 200k", "cold ≈ 6 min", "warm well under a minute"] {
        assert!(!readme.contains(best), "README still quotes `{best}`");
    }
    assert!(readme.contains("medians of repeated"), "README says how its figures were taken");
    // the end-to-end figures are ranges "A-B ms" of repeated runs, not one run's number
    for what in ["ms for\nthe nuScenes sweep", "ms for a 200k-point cloud"] {
        let at = readme.find(what).unwrap_or_else(|| panic!("README lost its `{what}` figure"));
        let figure = readme[..at].split_whitespace().last().unwrap_or_default();
        let parts: Vec<&str> = figure.split('-').collect();
        assert!(
            parts.len() == 2 && parts.iter().all(|p| p.parse::<f64>().is_ok()),
            "README's `{what}` figure `{figure}` is not a range of repeated runs"
        );
    }
    assert!(readme.contains("cold, about 8-12 min"), "README's cold test time");
}
