//! The docs say what the scripts, the build and the CLI do: a new user who follows them must not
//! hit paths, features, commands or figures that do not hold. Each check reads README.md, the
//! pages of docs/ and BENCHMARKS.md, and the file or program they describe.

mod common;
#[path = "common/viz_layouts.rs"]
mod viz_layouts;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn read(rel: &str) -> String {
    std::fs::read_to_string(common::root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The documentation pages: README.md (the newcomer's page), every page of docs/ (the detail, by
/// topic) and BENCHMARKS.md (the figures), as paths relative to the repository root.
fn doc_pages() -> Vec<String> {
    let mut pages: Vec<String> = std::fs::read_dir(common::root().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    pages.sort();
    let mut all = vec!["README.md".to_string()];
    all.extend(pages);
    all.push("BENCHMARKS.md".to_string());
    all
}

/// Every documentation page, one after another.
fn docs() -> String {
    doc_pages().iter().map(|p| read(p)).collect::<Vec<_>>().join("\n\n")
}

/// Lines of the docs' shell code blocks.
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

/// The text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut inside = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
            continue;
        }
        if !inside {
            out.push_str(line);
            out.push('\n');
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
    assert!(read("README.md").contains("~/.cache/sptr/target/release"), "README names the build directory");
    for (i, line) in readme.lines().enumerate() {
        for (k, _) in line.match_indices("target/release/") {
            assert!(
                line[..k].ends_with("~/.cache/sptr/") || line[..k].ends_with("$CARGO_TARGET_DIR/"),
                "docs line {}: a target/release path the two commands do not create: {line}",
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
    assert!(params.contains("device: cuda"), "the node's default device changed: revisit the docs' build lines");
    let builds: Vec<&str> = code_lines(&readme).into_iter().filter(|l| l.contains("--features ros")).collect();
    assert!(builds.len() >= 3, "the docs' node build lines: {builds:?}");
    for l in builds {
        assert!(
            l.contains("--features ros,cuda") || l.contains("--features ros --features cuda"),
            "the docs build the node without cuda: {l}"
        );
        // cargo-ament-build reads a comma list as one feature name and then installs no node
        assert!(!(l.contains("colcon build") && l.contains("ros,cuda")), "colcon needs two --features flags: {l}");
    }
    let test_ros = read("scripts/test_ros.sh");
    assert!(test_ros.contains("features=ros,cuda"), "scripts/test_ros.sh tests another build");
    assert!(test_ros.contains("--cargo-args --release --features ros --features cuda"), "scripts/test_ros.sh installs another build");
}

/// The PyPI wheels are Kilted; the script exports ROS_DISTRO=rolling because of r2r's version;
/// the docs and the script say so, for the r2r the lock file pins.
#[test]
fn ros_distro_rolling_is_explained() {
    let lock = read("Cargo.lock");
    let r2r = lock.split("[[package]]").find(|p| p.contains("name = \"r2r\"\n")).expect("r2r in Cargo.lock");
    assert!(r2r.contains("version = \"0.9.7\""), "r2r changed: does it know kilted now? Revisit ROS_DISTRO in scripts/ros_env.sh and docs/node.md");
    let env = read("scripts/ros_env.sh");
    assert!(env.contains("ROS_DISTRO) value=rolling"), "scripts/ros_env.sh exports another ROS_DISTRO");
    assert!(env.contains("Kilted") && env.contains("r2r 0.9.7"), "scripts/ros_env.sh does not say why");
    let readme = docs();
    // the paragraph of the docs that explains it (line breaks read as spaces)
    let para = readme
        .split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .find(|p| p.contains("exports `ROS_DISTRO=rolling`"))
        .expect("a docs paragraph on why scripts/ros_env.sh exports ROS_DISTRO=rolling");
    for w in ["Kilted", "r2r 0.9.7", "`kilted`", "ros-rclpy"] {
        assert!(para.contains(w), "the docs' ROS_DISTRO paragraph does not say `{w}`:\n{para}");
    }
}

/// Speed figures are the spread of repeated runs' medians, not a best run; test-time figures are
/// what a new machine sees.
#[test]
fn figures_are_measured_ranges() {
    let readme = docs();
    for best in ["6.2 ms for the", "17.5 ms for a 200k", "cold ≈ 6 min", "warm well under a minute"] {
        assert!(!readme.contains(best), "the docs still quote `{best}`");
    }
    assert!(readme.contains("medians of repeated"), "the docs say how their figures were taken");
    // the end-to-end figures are ranges "A-B ms" of repeated runs, not one run's number (line
    // breaks read as spaces)
    let flat = read("README.md").split_whitespace().collect::<Vec<_>>().join(" ");
    for what in ["ms for the nuScenes sweep", "ms for a 200k-point cloud"] {
        let at = flat.find(what).unwrap_or_else(|| panic!("README lost its `{what}` figure"));
        let figure = flat[..at].split_whitespace().last().unwrap_or_default();
        let parts: Vec<&str> = figure.split('-').collect();
        assert!(
            parts.len() == 2 && parts.iter().all(|p| p.parse::<f64>().is_ok()),
            "README's `{what}` figure `{figure}` is not a range of repeated runs"
        );
    }
    // the test time: no stale figure of an older pipeline, and the budget a cold run must keep
    for stale in ["cold, about 8-12 min", "warm, about 2-4 min"] {
        assert!(!readme.contains(stale), "README still quotes `{stale}`");
    }
    assert!(flat.contains("must end within 60 minutes"), "README states CI's cold-run budget");
}

/// Every BENCHMARKS.md table that has a machine or command column fills it in every row: a
/// figure without its machine and command cannot be reproduced.
#[test]
fn benchmark_rows_name_their_machine_and_command() {
    let text = prose(&read("BENCHMARKS.md"));
    let mut header: Option<Vec<String>> = None;
    let mut rows = 0;
    for line in text.lines() {
        let t = line.trim();
        if !t.starts_with('|') {
            header = None;
            continue;
        }
        let cells: Vec<String> = t.replace("\\|", "/").trim_matches('|').split('|').map(|c| c.trim().to_string()).collect();
        if cells.iter().all(|c| c.chars().all(|ch| ch == '-' || ch == ':' || ch == ' ')) {
            continue; // the separator row
        }
        if header.is_none() {
            header = Some(cells);
            continue;
        }
        let h = header.as_ref().unwrap();
        rows += 1;
        assert_eq!(cells.len(), h.len(), "BENCHMARKS.md row with {} cells under a {}-column header: {t}", cells.len(), h.len());
        for col in ["machine", "command"] {
            if let Some(i) = h.iter().position(|c| c == col) {
                assert!(!cells[i].is_empty(), "BENCHMARKS.md row without its {col}: {t}");
            }
        }
    }
    assert!(rows >= 30, "BENCHMARKS.md lost its rows ({rows})");
}

/// The docs speak of the product: no work-session or issue numbers.
#[test]
fn docs_carry_no_session_or_issue_numbers() {
    for page in doc_pages() {
        let text = read(&page).to_lowercase();
        assert!(!text.contains("session"), "{page} speaks of a session");
        for (k, _) in text.match_indices("issue") {
            let rest = text[k + "issue".len()..].trim_start_matches(' ').trim_start_matches('#');
            assert!(!rest.starts_with(|c: char| c.is_ascii_digit()), "{page} names an issue number: {}", text[k..].chars().take(12).collect::<String>());
        }
    }
}

/// GitHub's anchor of a heading: lower case, letters, digits, `-` and `_` kept, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every relative link of the docs reaches a file, and every `#anchor` a heading of it: the pages
/// move and merge, the links must follow. ARCHITECTURE.md may not be written yet.
#[test]
fn doc_links_resolve() {
    let root = common::root();
    let mut headings: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut anchors_of = |p: &Path| -> HashSet<String> {
        headings
            .entry(p.to_path_buf())
            .or_insert_with(|| {
                let text = prose(&std::fs::read_to_string(p).unwrap_or_default());
                text.lines().filter(|l| l.starts_with('#')).map(|l| anchor(l.trim_start_matches('#'))).collect()
            })
            .clone()
    };
    let mut links = 0;
    for page in doc_pages() {
        let text = prose(&read(&page));
        for (k, _) in text.match_indices("](") {
            let target: String = text[k + 2..].chars().take_while(|&c| c != ')' && !c.is_whitespace()).collect();
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            links += 1;
            let (path, frag) = target.split_once('#').unwrap_or((target.as_str(), ""));
            let file = if path.is_empty() {
                root.join(&page)
            } else {
                let joined = root.join(&page).parent().unwrap().join(path);
                // `docs/../README.md` -> `README.md`, without touching the file system
                let mut norm = PathBuf::new();
                for c in joined.components() {
                    match c {
                        std::path::Component::ParentDir => {
                            norm.pop();
                        }
                        c => norm.push(c),
                    }
                }
                norm
            };
            if !file.exists() {
                assert!(file.file_name().is_some_and(|n| n == "ARCHITECTURE.md"), "{page}: link to a missing file: {target}");
                continue;
            }
            if !frag.is_empty() && file.extension().is_some_and(|x| x == "md") {
                assert!(anchors_of(file.as_path()).contains(frag), "{page}: link to a missing heading: {target}");
            }
        }
    }
    assert!(links >= 50, "the docs lost their links ({links})");
}

/// The docs and the READMEs of tests/: the doc pages, ARCHITECTURE.md, tests/parity/README.md
/// and tests/data/README.md.
fn pages_naming_files() -> Vec<String> {
    let mut pages = doc_pages();
    pages.extend(["ARCHITECTURE.md", "tests/parity/README.md", "tests/data/README.md"].map(String::from));
    pages
}

/// Files the docs name under scripts/, config/, launch/, kernels/ and tests/ exist (paths with a
/// pattern or placeholder in them are not checked): a moved test file or fixture takes its
/// mentions along.
#[test]
fn doc_paths_exist() {
    let root = common::root();
    for page in pages_naming_files() {
        let text = read(&page);
        for prefix in ["scripts/", "config/", "launch/", "kernels/", "tests/"] {
            for (k, _) in text.match_indices(prefix) {
                if text[..k].ends_with(|c: char| c.is_alphanumeric() || "/._-~$".contains(c)) {
                    continue; // part of a longer path (e.g. share/sptr/config/...)
                }
                let path: String = text[k..].chars().take_while(|&c| c.is_alphanumeric() || "/._-".contains(c)).collect();
                let next = text[k + path.len()..].chars().next().unwrap_or(' ');
                if "{*<".contains(next) {
                    continue;
                }
                let path = path.trim_end_matches(['.', ',']);
                assert!(root.join(path).exists(), "{page} names {path}, which does not exist");
            }
        }
    }
}

/// Whether `name` is an integration test target: `tests/NAME.rs` or `tests/NAME/main.rs`.
fn is_test_target(root: &Path, name: &str) -> bool {
    root.join("tests").join(format!("{name}.rs")).is_file() || root.join("tests").join(name).join("main.rs").is_file()
}

/// The test targets the docs and the scripts run (`cargo test --test NAME`, a staged
/// `gpu-stage/bin/test-NAME`, `` `test-NAME` `` in prose) exist: a parity run on the GPU host must
/// not find out there that a binary was renamed.
#[test]
fn test_targets_named_exist() {
    let root = common::root();
    let mut files = pages_naming_files();
    let mut scripts: Vec<String> = std::fs::read_dir(root.join("scripts"))
        .expect("scripts/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .map(|p| format!("scripts/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    scripts.sort();
    files.extend(scripts);
    let mut named = 0;
    for file in files {
        let text = read(&file);
        for marker in ["--test ", "bin/test-", "`test-"] {
            for (k, _) in text.match_indices(marker) {
                let name: String = text[k + marker.len()..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) || text[k + marker.len() + name.len()..].starts_with('*') {
                    continue; // a variable, a placeholder or a pattern (`test-$t`, `test-<target>`, `test-*.log`)
                }
                // gpu_suite.sh stages the library's unit tests as test-sptr-lib
                if name == "sptr" && text[k + marker.len() + name.len()..].starts_with("-lib") {
                    continue;
                }
                assert!(is_test_target(&root, &name), "{file} runs the test target `{name}`, which does not exist (tests/{name}.rs or tests/{name}/main.rs)");
                named += 1;
            }
        }
    }
    assert!(named >= 10, "the docs and scripts name fewer test targets than expected ({named})");
}

/// The layout ARCHITECTURE.md gives the tests: each directory target's `main.rs` declares the
/// shared helpers and every module file beside it (cargo compiles only what main.rs declares: an
/// undeclared file's tests would silently never run).
#[test]
fn test_directories_declare_every_module() {
    let root = common::root();
    let mut targets = 0;
    for dir in std::fs::read_dir(root.join("tests")).expect("tests/").filter_map(|e| e.ok().map(|e| e.path())) {
        let main = dir.join("main.rs");
        if !main.is_file() {
            continue;
        }
        targets += 1;
        let text = std::fs::read_to_string(&main).unwrap();
        let what = dir.strip_prefix(&root).unwrap_or(&dir).display().to_string();
        assert!(text.contains("#[path = \"../common/mod.rs\"]\nmod common;"), "{what}/main.rs does not declare tests/common");
        assert!(text.starts_with("//!"), "{what}/main.rs does not say what the target covers");
        for f in std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok().map(|e| e.path())) {
            let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
            if f.extension().is_some_and(|x| x == "rs") && stem != "main" {
                assert!(text.lines().any(|l| l.trim() == format!("mod {stem};")), "{what}/main.rs does not declare `mod {stem};`: its tests never run");
            }
        }
    }
    assert!(targets >= 10, "tests/ has fewer directory targets than ARCHITECTURE.md describes ({targets})");
}

/// `sptr --help` (or a subcommand's) output, cached.
fn help(cache: &mut HashMap<Vec<String>, String>, words: &[&str]) -> String {
    let key: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    cache
        .entry(key)
        .or_insert_with(|| {
            let out = Command::new(common::sptr_exe()).args(words).arg("--help").output().expect("run sptr --help");
            assert!(out.status.success(), "sptr {} --help failed: {}", words.join(" "), String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .clone()
}

/// The command names of a help text's `Commands:` section.
fn subcommands(help: &str) -> HashSet<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The `--flags` a help text lists.
fn flags(help: &str) -> HashSet<String> {
    help.match_indices("--")
        .map(|(k, _)| {
            let name: String = help[k + 2..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            format!("--{name}")
        })
        .collect()
}

/// Every `sptr` command the docs show (shell blocks, continuation lines joined, and inline code)
/// names a subcommand `sptr` has, with flags its `--help` lists.
#[test]
fn doc_commands_exist() {
    let mut cache = HashMap::new();
    let top = subcommands(&help(&mut cache, &[]));
    assert!(top.contains("replay") && top.contains("bench"), "sptr --help lists no commands: {top:?}");
    let mut commands: Vec<(String, String)> = Vec::new();
    for page in doc_pages() {
        let text = read(&page);
        let mut joined = String::new();
        for line in code_lines(&text) {
            match line.trim_end().strip_suffix('\\') {
                Some(head) => {
                    joined.push_str(head);
                    joined.push(' ');
                }
                None => {
                    joined.push_str(line);
                    commands.push((page.clone(), std::mem::take(&mut joined)));
                }
            }
        }
        for (i, span) in prose(&text).split('`').enumerate() {
            if i % 2 == 1 {
                commands.push((page.clone(), span.replace('\\', "")));
            }
        }
    }
    let word = |w: &str| !w.is_empty() && w.starts_with(|c: char| c.is_ascii_lowercase()) && w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let mut checked = 0;
    for (page, line) in commands {
        let line = line.split(" # ").next().unwrap_or_default();
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() != Some(&"sptr") || words.len() < 2 || !word(words[1]) {
            continue;
        }
        assert!(top.contains(words[1]), "{page}: `sptr {}` is not a command of sptr: {line}", words[1]);
        let mut path = vec![words[1]];
        let sub = subcommands(&help(&mut cache, &path));
        if !sub.is_empty() {
            match words.get(2).copied() {
                Some(w) if word(w) => {
                    assert!(sub.contains(w), "{page}: `sptr {} {w}` is not a command of sptr: {line}", words[1]);
                    path.push(w);
                }
                _ => continue, // a command group named on its own (`sptr bench ...`)
            }
        }
        let known = flags(&help(&mut cache, &path));
        for w in &words[path.len() + 1..] {
            let w = w.trim_start_matches(['[', '(']).split(['|', '=', ']', ')', ',', ';']).next().unwrap_or_default();
            if w.len() > 2 && w.starts_with("--") {
                assert!(known.contains(w), "{page}: `sptr {}` has no {w}: {line}", path.join(" "));
            }
        }
        checked += 1;
    }
    assert!(checked >= 40, "the docs show fewer sptr commands than expected ({checked})");
}

/// The viewer layouts docs/node.md points to (rviz2's `config/rviz/sptr.rviz`, the Foxglove
/// layout `config/foxglove/sptr.json`) parse as their viewers read them and show the same
/// topics: exactly the node's outputs under the default launch (the labeled cloud, the three BEV
/// grids, each BEV map class and the map's colour image), each in a display of its message type.
/// The labeled cloud is coloured by `class_id` over the model's fixed id range, every rviz2
/// subscription is volatile (a transient-local one would not match the node's writers), and the
/// launch file's `rviz:=true` opens the installed rviz2 file. `tests/ros_node.rs` checks over DDS
/// that the node publishes each of these topics.
#[test]
fn viewer_layouts_show_the_node_outputs() {
    use viz_layouts::*;
    let root = common::root();
    let rviz = rviz_topics(&root);
    let foxglove = foxglove_topics(&root);
    let rviz_names: std::collections::BTreeSet<String> = rviz.keys().cloned().collect();
    assert_eq!(rviz_names, foxglove, "{RVIZ} and {FOXGLOVE} show different topics");
    let classes = map_classes(&root);
    assert_eq!(classes.len(), 6, "BEVFusion's six nuScenes map classes: {classes:?}");
    let expected = expected_topics(&root, &classes);
    assert_eq!(rviz, expected, "{RVIZ}: not the node's outputs under the default launch (topic -> type)");
    for t in ["/sptr/output/points", "/sptr/output/bev/labels_color", "/sptr/output/bev/map/drivable_area"] {
        assert!(expected.contains_key(t), "{t} missing from the expected topics: {expected:?}");
    }

    let params = sptr::frame::params::NodeParams::load(&root.join("config/perception.yaml")).expect("config/perception.yaml");
    let model = root.join("config").join(&params.model.config);
    let classes = sptr::models::sphereformer::config::ModelConfig::load(&model).expect("the params file's model").yaml.classes;
    let top_id = (classes - 1) as f64;
    let displays = rviz_displays(&root);
    let num = |v: &serde_yaml::Value, k: &str| v.get(k).and_then(|x| x.as_f64()).unwrap_or_else(|| panic!("{RVIZ}: no number {k}"));
    let text = |v: &serde_yaml::Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_else(|| panic!("{RVIZ}: no {k}")).to_string();
    let cloud = displays.iter().find(|d| class_of(d) == "rviz_default_plugins/PointCloud2").expect("a PointCloud2 display");
    assert_eq!(text(cloud, "Color Transformer"), "Intensity");
    assert_eq!(text(cloud, "Channel Name"), "class_id");
    assert_eq!(cloud.get("Autocompute Intensity Bounds").and_then(|b| b.as_bool()), Some(false), "class colours must not follow the frame");
    assert_eq!((num(cloud, "Min Intensity"), num(cloud, "Max Intensity")), (0.0, top_id), "the model's class ids");
    for d in &displays {
        if let Some(t) = d.get("Topic").filter(|t| t.is_mapping()) {
            assert_eq!(text(t, "Durability Policy"), "Volatile", "{RVIZ}: {:?}", topic_of(d));
            assert_eq!(text(t, "Reliability Policy"), "Reliable", "{RVIZ}: {:?}", topic_of(d));
        }
    }
    let doc: serde_yaml::Value = serde_yaml::from_str(&read(RVIZ)).unwrap();
    assert_eq!(doc["Visualization Manager"]["Global Options"]["Fixed Frame"].as_str(), Some(params.bev.frame_id.as_str()), "{RVIZ}: the BEV grids' frame");

    let fox = foxglove_layout(&root);
    let (id, panel) = fox["configById"].as_object().unwrap().iter().find(|(id, _)| id.starts_with("3D!")).expect("a 3D panel");
    let points = &panel["topics"]["/sptr/output/points"];
    assert_eq!(points["colorField"], "class_id", "{FOXGLOVE}: {id}");
    assert_eq!(points["colorMode"], "colormap", "{FOXGLOVE}: {id}");
    assert_eq!((points["minValue"].as_f64(), points["maxValue"].as_f64()), (Some(0.0), Some(top_id)), "{FOXGLOVE}: {id}");
    assert_eq!(panel["followTf"].as_str(), Some(params.bev.frame_id.as_str()), "{FOXGLOVE}: {id}");

    let launch = read("launch/perception.launch.py");
    for needle in ["DeclareLaunchArgument(\"rviz\", default_value=\"false\"", "package=\"rviz2\"", "IfCondition(", "\"config\", \"rviz\", \"sptr.rviz\""] {
        assert!(launch.contains(needle), "launch/perception.launch.py: no `{needle}`");
    }
}
