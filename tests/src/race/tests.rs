use super::shot::parse_shot;
use super::*;

#[test]
fn parses_ct_stats() {
    let text = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n\
0000000a  00000002 00000000 00000000 00000003 00000000 00000000 00000000 00000000 0000000b 0000000c 00000000 00000000  00000000 00000000 00000000 00000000\n\
0000000a  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000001 00000000 00000000  00000000 00000000 00000000 00000000\n";
    let rows = parse_ct_stats(text).unwrap();
    assert_eq!(rows, vec![(11, 12, 2), (1, 1, 0)]);
    assert_eq!(ct_totals(&rows), (12, 13, 2));
    assert!(parse_ct_stats("entries found\n1 2\n").is_err());
}

#[test]
fn parses_shot() {
    let out = "src_port=40000\na_id=7\naaaa_id=9\nanswer id=9 from=10.244.1.3:53 rcode=3 ms=52\nanswer id=9 from=10.244.1.4:53 rcode=3 ms=53\n";
    let s = parse_shot(out).unwrap();
    assert_eq!((s.src_port, s.a_id, s.aaaa_id), (40000, 7, 9));
    assert!(!s.a_answered);
    assert!(s.aaaa_answered);
    assert_eq!(s.aaaa_answers, 2);
    assert!(parse_shot("a_id=1\n").is_none());
}

#[test]
fn parses_summary() {
    let s = parse_summary("ready queue=0 hold_ms=300\nheld=10 immediate=0 released_on_exit=1 verdict_errors=0 enobufs=0\n").unwrap();
    assert_eq!(s.held, 10);
    assert_eq!(s.released_on_exit, 1);
}
