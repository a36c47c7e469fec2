#![allow(clippy::unwrap_used, reason = "tests")]
use super::{
    report::failures_of,
    setup::{is_plain_image, numbers},
};

#[test]
fn picks_the_newest_plain_image_of_a_series() {
    let names = [
        "linux-image-6.1.0-56-amd64",
        "linux-image-6.1.0-57-amd64",
        "linux-image-6.1.0-57-amd64-dbg",
        "linux-image-6.1.0-57-amd64-unsigned",
        "linux-image-6.1.0-57-cloud-amd64",
        "linux-image-6.1.0-57-rt-amd64",
        "linux-image-6.12.95+deb12-amd64",
        "linux-image-6.12.117+deb12-amd64",
        "linux-image-6.12.117+deb12-cloud-amd64",
        "linux-image-5.10.0-46-amd64",
    ];
    let newest = |series| {
        names
            .iter()
            .filter(|n| is_plain_image(n, series, "amd64"))
            .max_by_key(|n| numbers(n))
            .copied()
    };
    assert_eq!(newest("6.1"), Some("linux-image-6.1.0-57-amd64"));
    assert_eq!(newest("6.12"), Some("linux-image-6.12.117+deb12-amd64"));
    assert_eq!(newest("5.10"), Some("linux-image-5.10.0-46-amd64"));
    assert_eq!(newest("6.6"), None);
}

#[test]
fn report_failures_name_the_check_and_the_step() {
    let report: Vec<(String, String)> = [
        ("check.load", "ok 15 programs"),
        ("check.drop", "FAIL no drop record"),
        ("step", "clean-exit: checking what is left"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let f = failures_of(&report, None, Some("timed out after 330 s".into()), "x");
    assert_eq!(
        f,
        [
            "drop: no drop record",
            "timed out after 330 s, during: clean-exit: checking what is left"
        ]
    );
    let ok = [("check.load".to_string(), "ok".to_string())];
    assert!(failures_of(&ok, Some(0), None, "x").is_empty());
    assert_eq!(failures_of(&ok, Some(101), None, "x"), ["x"]);
}
