//! Cron schedules as kube-controller-manager v1.34 reads them (robfig/cron v3's `ParseStandard`):
//! five fields (minute, hour, day of month, month, day of week) with `*`, `?`, lists, ranges,
//! steps and the month and weekday names; the descriptors `@yearly`, `@annually`, `@monthly`,
//! `@weekly`, `@daily`, `@midnight`, `@hourly` and `@every <duration>`; a `CRON_TZ=<zone>` or
//! `TZ=<zone>` prefix. [`Schedule::next`] is robfig's `SpecSchedule.Next` (the first activation
//! strictly after a time, within five years).
//!
//! Owns nothing but parsing and time arithmetic; zones come from the system's tz database.

use crate::helpers::duration::parse_go_duration;
use std::time::Duration;

use jiff::civil::date;
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, Zoned};

const STAR: u64 = 1 << 63;

#[derive(Debug, Clone, Copy)]
struct Bounds {
    min: u32,
    max: u32,
    names: &'static [(&'static str, u32)],
}

const SECONDS: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const MINUTES: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOURS: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
const MONTHS: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        ("jan", 1),
        ("feb", 2),
        ("mar", 3),
        ("apr", 4),
        ("may", 5),
        ("jun", 6),
        ("jul", 7),
        ("aug", 8),
        ("sep", 9),
        ("oct", 10),
        ("nov", 11),
        ("dec", 12),
    ],
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &[
        ("sun", 0),
        ("mon", 1),
        ("tue", 2),
        ("wed", 3),
        ("thu", 4),
        ("fri", 5),
        ("sat", 6),
    ],
};

/// A parsed schedule.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// Field bitmaps (bit n set: value n matches; bit 63: the field was `*` or `?`).
    Spec {
        /// Seconds (always 0 for the standard syntax).
        second: u64,
        /// Minutes.
        minute: u64,
        /// Hours.
        hour: u64,
        /// Days of the month.
        dom: u64,
        /// Months.
        month: u64,
        /// Days of the week (0 = Sunday).
        dow: u64,
        /// The zone the fields are read in.
        tz: TimeZone,
    },
    /// `@every <duration>`: a fixed delay (whole seconds, at least one).
    Every(Duration),
}

fn bits(min: u32, max: u32, step: u32) -> u64 {
    let mut b = 0u64;
    let mut i = min;
    while i <= max {
        b |= 1 << i;
        i += step;
    }
    b
}

fn all(r: Bounds) -> u64 {
    bits(r.min, r.max, 1) | STAR
}

fn parse_int(expr: &str) -> Result<u32, String> {
    let n: i64 = expr
        .parse()
        .map_err(|e| format!("failed to parse int from {expr}: {e}"))?;
    if n < 0 {
        return Err(format!("negative number ({n}) not allowed: {expr}"));
    }
    u32::try_from(n).map_err(|_| format!("number too large: {expr}"))
}

fn parse_int_or_name(expr: &str, r: Bounds) -> Result<u32, String> {
    let lower = expr.to_ascii_lowercase();
    if let Some((_, v)) = r.names.iter().find(|(n, _)| *n == lower) {
        return Ok(*v);
    }
    parse_int(expr)
}

/// One comma-separated part of a field (robfig's `getRange`).
fn range(expr: &str, r: Bounds) -> Result<u64, String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_high.len() == 1;
    let (start, mut end, mut extra);
    if low_high[0] == "*" || low_high[0] == "?" {
        start = r.min;
        end = r.max;
        extra = STAR;
    } else {
        start = parse_int_or_name(low_high[0], r)?;
        end = match low_high.len() {
            1 => start,
            2 => parse_int_or_name(low_high[1], r)?,
            _ => return Err(format!("too many hyphens: {expr}")),
        };
        extra = 0;
    }
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = parse_int(range_and_step[1])?;
            // "N/step" means "N-max/step".
            if single {
                end = r.max;
            }
            if step > 1 {
                extra = 0;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < r.min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({}): {expr}",
            r.min
        ));
    }
    if end > r.max {
        return Err(format!(
            "end of range ({end}) above maximum ({}): {expr}",
            r.max
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    Ok(bits(start, end, step) | extra)
}

fn field(f: &str, r: Bounds) -> Result<u64, String> {
    let mut b = 0;
    for part in f.split(',').filter(|p| !p.is_empty()) {
        b |= range(part, r)?;
    }
    Ok(b)
}

/// Go's `time.LoadLocation`: "" and "UTC" are UTC, "Local" the process's zone, anything else a
/// name in the tz database.
pub fn load_location(name: &str) -> Result<TimeZone, String> {
    match name {
        "" | "UTC" => Ok(TimeZone::UTC),
        "Local" => Ok(TimeZone::system()),
        _ => TimeZone::get(name).map_err(|e| format!("unknown time zone {name}: {e}")),
    }
}

impl Schedule {
    /// Parses a standard cron spec (robfig's `ParseStandard`); errors read like upstream's.
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        if spec.is_empty() {
            return Err("empty spec string".into());
        }
        let mut spec = spec;
        let mut tz = TimeZone::system();
        if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
            let space = spec
                .find(' ')
                .ok_or_else(|| format!("provided bad location {spec}: no schedule after it"))?;
            let eq = spec.find('=').expect("prefix has =");
            let name = &spec[eq + 1..space];
            tz = load_location(name).map_err(|e| format!("provided bad location {name}: {e}"))?;
            spec = spec[space..].trim();
        }
        if spec.starts_with('@') {
            return Self::descriptor(spec, tz);
        }
        let fields: Vec<&str> = spec.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: [{}]",
                fields.len(),
                fields.join(" ")
            ));
        }
        Ok(Schedule::Spec {
            second: 1,
            minute: field(fields[0], MINUTES)?,
            hour: field(fields[1], HOURS)?,
            dom: field(fields[2], DOM)?,
            month: field(fields[3], MONTHS)?,
            dow: field(fields[4], DOW)?,
            tz,
        })
    }

    fn descriptor(d: &str, tz: TimeZone) -> Result<Schedule, String> {
        let first = |r: Bounds| 1u64 << r.min;
        let (minute, hour, dom, month, dow) = match d {
            "@yearly" | "@annually" => (
                first(MINUTES),
                first(HOURS),
                first(DOM),
                first(MONTHS),
                all(DOW),
            ),
            "@monthly" => (
                first(MINUTES),
                first(HOURS),
                first(DOM),
                all(MONTHS),
                all(DOW),
            ),
            "@weekly" => (
                first(MINUTES),
                first(HOURS),
                all(DOM),
                all(MONTHS),
                first(DOW),
            ),
            "@daily" | "@midnight" => (
                first(MINUTES),
                first(HOURS),
                all(DOM),
                all(MONTHS),
                all(DOW),
            ),
            "@hourly" => (first(MINUTES), all(HOURS), all(DOM), all(MONTHS), all(DOW)),
            _ => {
                if let Some(dur) = d.strip_prefix("@every ") {
                    let dur = parse_go_duration(dur)
                        .map_err(|e| format!("failed to parse duration {d}: {e}"))?;
                    let secs = dur.as_secs().max(1);
                    return Ok(Schedule::Every(Duration::from_secs(secs)));
                }
                return Err(format!("unrecognized descriptor: {d}"));
            }
        };
        Ok(Schedule::Spec {
            second: first(SECONDS),
            minute,
            hour,
            dom,
            month,
            dow,
            tz,
        })
    }

    /// The first activation strictly after `t` (robfig's `Next`); `None` when there is none
    /// within five years (e.g. February 30th).
    pub fn next(&self, t: Timestamp) -> Option<Timestamp> {
        let (second, minute, hour, dom, month, dow, tz) = match self {
            Schedule::Every(d) => {
                let whole = Timestamp::from_second(t.as_second()).ok()?;
                return whole.checked_add(*d).ok();
            }
            Schedule::Spec {
                second,
                minute,
                hour,
                dom,
                month,
                dow,
                tz,
            } => (*second, *minute, *hour, *dom, *month, *dow, tz.clone()),
        };
        let day_matches = |z: &Zoned| {
            let dom_match = (1u64 << z.day()) & dom > 0;
            let dow_match = (1u64 << z.weekday().to_sunday_zero_offset()) & dow > 0;
            if dom & STAR > 0 || dow & STAR > 0 {
                dom_match && dow_match
            } else {
                dom_match || dow_match
            }
        };
        let at = |y: i16, m: i8, d: i8, h: i8| date(y, m, d).at(h, 0, 0, 0).to_zoned(tz.clone());
        // Start at the next whole second.
        let start = Timestamp::from_second(t.as_second().checked_add(1)?).ok()?;
        let mut z = start.to_zoned(tz.clone());
        let mut added = false;
        let year_limit = z.year() + 5;
        'wrap: loop {
            if z.year() > year_limit {
                return None;
            }
            while (1u64 << z.month()) & month == 0 {
                if !added {
                    added = true;
                    z = at(z.year(), z.month(), 1, 0).ok()?;
                }
                z = z.checked_add(Span::new().months(1)).ok()?;
                if z.month() == 1 {
                    continue 'wrap;
                }
            }
            while !day_matches(&z) {
                if !added {
                    added = true;
                    z = at(z.year(), z.month(), z.day(), 0).ok()?;
                }
                z = z.checked_add(Span::new().days(1)).ok()?;
                // Midnight may not exist or repeat at a DST change: back onto the day boundary.
                if z.hour() != 0 {
                    let h = i64::from(z.hour());
                    let adjust = if h > 12 { 24 - h } else { -h };
                    z = z.checked_add(Span::new().hours(adjust)).ok()?;
                }
                if z.day() == 1 {
                    continue 'wrap;
                }
            }
            while (1u64 << z.hour()) & hour == 0 {
                if !added {
                    added = true;
                    z = at(z.year(), z.month(), z.day(), z.hour()).ok()?;
                }
                z = z.checked_add(Span::new().hours(1)).ok()?;
                if z.hour() == 0 {
                    continue 'wrap;
                }
            }
            while (1u64 << z.minute()) & minute == 0 {
                if !added {
                    added = true;
                    let s = z.timestamp().as_second();
                    z = Timestamp::from_second(s - s.rem_euclid(60))
                        .ok()?
                        .to_zoned(tz.clone());
                }
                z = z.checked_add(Span::new().minutes(1)).ok()?;
                if z.minute() == 0 {
                    continue 'wrap;
                }
            }
            while (1u64 << z.second()) & second == 0 {
                if !added {
                    added = true;
                }
                z = z.checked_add(Span::new().seconds(1)).ok()?;
                if z.second() == 0 {
                    continue 'wrap;
                }
            }
            return Some(z.timestamp());
        }
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
