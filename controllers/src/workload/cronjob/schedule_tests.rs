//! Cron parsing and next-time arithmetic against values robfig/cron v3 (upstream's parser)
//! gives for the same specs.

use super::*;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

#[test]
fn cj1_next_times_follow_standard_cron_syntax() {
    // (name, spec, after, want next)
    let cases: &[(&str, &str, &str, Option<&str>)] = &[
        (
            "CJ-1 every minute",
            "TZ=UTC * * * * *",
            "2026-11-26T00:00:30Z",
            Some("2026-11-26T00:01:00Z"),
        ),
        (
            "CJ-1 strictly after: a time on the schedule gives the next one",
            "TZ=UTC * * * * *",
            "2026-11-26T00:01:00Z",
            Some("2026-11-26T00:02:00Z"),
        ),
        (
            "CJ-1 step from star",
            "TZ=UTC */15 * * * *",
            "2026-11-26T00:16:00Z",
            Some("2026-11-26T00:30:00Z"),
        ),
        (
            "CJ-1 range with step",
            "TZ=UTC 10-40/10 3 * * *",
            "2026-11-26T03:31:00Z",
            Some("2026-11-26T03:40:00Z"),
        ),
        (
            "CJ-1 N/step means N-max/step",
            "TZ=UTC 50/5 * * * *",
            "2026-11-26T00:56:00Z",
            Some("2026-11-26T01:50:00Z"),
        ),
        (
            "CJ-1 list",
            "TZ=UTC 0 1,13 * * *",
            "2026-11-26T02:00:00Z",
            Some("2026-11-26T13:00:00Z"),
        ),
        (
            "CJ-1 month and weekday names, case-insensitive",
            "TZ=UTC 0 0 * JAN mon",
            "2026-11-26T00:00:00Z",
            Some("2027-01-04T00:00:00Z"),
        ),
        (
            "CJ-1 day of month OR day of week when neither is a star",
            "TZ=UTC 0 0 1 * fri",
            "2026-11-26T00:00:00Z",
            Some("2026-11-27T00:00:00Z"),
        ),
        (
            "CJ-1 day of month AND day of week when one is a star",
            "TZ=UTC 0 0 * * fri",
            "2026-11-28T00:00:00Z",
            Some("2026-12-04T00:00:00Z"),
        ),
        (
            "CJ-1 question mark is a star",
            "TZ=UTC 0 12 ? * ?",
            "2026-11-26T12:00:00Z",
            Some("2026-11-27T12:00:00Z"),
        ),
        (
            "CJ-1 @hourly",
            "TZ=UTC @hourly",
            "2026-11-26T00:59:59Z",
            Some("2026-11-26T01:00:00Z"),
        ),
        (
            "CJ-1 @daily",
            "TZ=UTC @daily",
            "2026-11-26T00:00:00Z",
            Some("2026-11-27T00:00:00Z"),
        ),
        (
            "CJ-1 @weekly is Sunday midnight",
            "TZ=UTC @weekly",
            "2026-11-26T00:00:00Z",
            Some("2026-11-29T00:00:00Z"),
        ),
        (
            "CJ-1 @monthly",
            "TZ=UTC @monthly",
            "2026-11-26T00:00:00Z",
            Some("2026-12-01T00:00:00Z"),
        ),
        (
            "CJ-1 @yearly",
            "TZ=UTC @yearly",
            "2026-11-26T00:00:00Z",
            Some("2027-01-01T00:00:00Z"),
        ),
        (
            "CJ-1 @every adds to the whole second",
            "@every 90s",
            "2026-11-26T00:00:00.5Z",
            Some("2026-11-26T00:01:30Z"),
        ),
        (
            "CJ-1 February 30th never comes (five-year limit)",
            "TZ=UTC 0 0 30 2 *",
            "2026-11-26T00:00:00Z",
            None,
        ),
        (
            "CJ-1 leap day",
            "TZ=UTC 0 0 29 2 *",
            "2026-11-26T00:00:00Z",
            Some("2028-02-29T00:00:00Z"),
        ),
        (
            "CJ-1 CRON_TZ: 09:00 in New York is 14:00 UTC in winter",
            "CRON_TZ=America/New_York 0 9 * * *",
            "2026-11-26T15:00:00Z",
            Some("2026-11-27T14:00:00Z"),
        ),
        (
            "CJ-1 time zone across a DST change: 09:00 in New York is 13:00 UTC in summer",
            "TZ=America/New_York 0 9 * * *",
            "2026-03-07T15:00:00Z",
            Some("2026-03-08T13:00:00Z"),
        ),
        (
            "CJ-1 a time DST skips (02:30 on 2026-03-08 in New York) is skipped, as robfig's",
            "TZ=America/New_York 30 2 8 3 *",
            "2026-03-01T00:00:00Z",
            Some("2027-03-08T07:30:00Z"),
        ),
    ];
    for (name, spec, after, want) in cases {
        let s = Schedule::parse(spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = s.next(ts(after));
        assert_eq!(got, want.map(ts), "{name}: {spec} after {after}");
    }
}

#[test]
fn cj1_invalid_specs_are_errors_naming_the_problem() {
    let cases: &[(&str, &str, &str)] = &[
        ("CJ-1 empty", "", "empty spec"),
        ("CJ-1 four fields", "* * * *", "expected exactly 5 fields"),
        (
            "CJ-1 six fields",
            "0 * * * * *",
            "expected exactly 5 fields",
        ),
        ("CJ-1 minute above 59", "60 * * * *", "above maximum"),
        ("CJ-1 day of month 0", "0 0 0 * *", "below minimum"),
        (
            "CJ-1 weekday 7 (robfig's range is 0-6)",
            "0 0 * * 7",
            "above maximum",
        ),
        ("CJ-1 reversed range", "5-1 * * * *", "beyond end of range"),
        ("CJ-1 zero step", "*/0 * * * *", "positive number"),
        ("CJ-1 two slashes", "*/2/3 * * * *", "too many slashes"),
        ("CJ-1 two hyphens", "1-2-3 * * * *", "too many hyphens"),
        ("CJ-1 unknown name", "0 0 * foo *", "failed to parse int"),
        (
            "CJ-1 unknown descriptor",
            "@fortnightly",
            "unrecognized descriptor",
        ),
        (
            "CJ-1 unknown zone",
            "TZ=Mars/Olympus * * * * *",
            "bad location",
        ),
        ("CJ-1 bad @every", "@every soon", "failed to parse duration"),
    ];
    for (name, spec, want) in cases {
        match Schedule::parse(spec) {
            Ok(s) => panic!("{name}: {spec:?} parsed as {s:?}"),
            Err(e) => assert!(e.contains(want), "{name}: {e:?} lacks {want:?}"),
        }
    }
}
