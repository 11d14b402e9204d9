//! Kubernetes resource Quantities (`resource.Quantity`) as numbers, and numbers back as
//! Quantities in the API server's canonical form: what the scheduler sums as requests and the
//! autoscaler compares with metrics.

/// A Kubernetes Quantity as a number scaled by 10^`scale10` (3 for milli-units, 0 for units),
/// rounded up as `resource.Quantity.MilliValue` / `Value` round. None when it does not parse.
fn parse_scaled(s: &str, scale10: i32) -> Option<i64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let (binary_exp, decimal_exp): (u32, i32) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        e if e.starts_with(['e', 'E']) => (0, e[1..].parse().ok()?),
        _ => return None,
    };
    let negative = num.starts_with('-');
    let digits = num.trim_start_matches(['+', '-']);
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    // mantissa * 10^(exp) * 2^binary_exp, computed in i128 and rounded up (away from zero for
    // positive values, as Quantity does for MilliValue).
    let mantissa: i128 = format!("{int_part}{frac_part}").parse().ok()?;
    let exp = decimal_exp + scale10 - frac_part.len() as i32;
    let mut value = mantissa.checked_mul(1i128 << binary_exp)?;
    if exp >= 0 {
        value = value.checked_mul(10i128.checked_pow(exp as u32)?)?;
    } else {
        let div = 10i128.checked_pow((-exp) as u32)?;
        value = (value + div - 1) / div;
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).ok()
}

/// A Quantity in milli-units (CPU), rounded up; None when it does not parse.
pub fn parse_milli(s: &str) -> Option<i64> {
    parse_scaled(s, 3)
}

/// A Quantity in units (bytes, counts), rounded up; None when it does not parse.
pub fn parse_value(s: &str) -> Option<i64> {
    parse_scaled(s, 0)
}

/// A milli-value as the canonical decimal Quantity `resource.NewMilliQuantity(v, DecimalSI)`
/// prints: the largest of m, (none), k, M, G, T, P, E that keeps the number whole ("500m", "1",
/// "1500m", "2k").
pub fn format_milli_decimal(milli: i64) -> String {
    if milli == 0 {
        return "0".to_string();
    }
    let suffixes = ["m", "", "k", "M", "G", "T", "P", "E"];
    let mut value = milli;
    let mut i = 0;
    while i + 1 < suffixes.len() && value % 1000 == 0 {
        value /= 1000;
        i += 1;
    }
    format!("{value}{}", suffixes[i])
}

/// A milli-value as `resource.NewMilliQuantity(v, BinarySI)` prints: a whole number of units
/// with the largest power-of-1024 suffix that keeps it whole ("123Mi", "2000"); below 1024 units
/// or with a fractional part, the decimal form ("1k", "1500m"), as `CanonicalizeBytes` does.
pub fn format_milli_binary(milli: i64) -> String {
    if milli % 1000 != 0 || milli.abs() < 1024 * 1000 {
        return format_milli_decimal(milli);
    }
    let suffixes = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = milli / 1000;
    let mut i = 0;
    while i + 1 < suffixes.len() && value % 1024 == 0 {
        value /= 1024;
        i += 1;
    }
    format!("{value}{}", suffixes[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_the_api_server_writes_them() {
        for (s, milli, value) in [
            ("100m", Some(100), Some(1)),
            ("1", Some(1000), Some(1)),
            ("1.5", Some(1500), Some(2)),
            ("2Gi", Some(2 * 1024 * 1024 * 1024 * 1000), Some(2 << 30)),
            ("128974848", Some(128_974_848_000), Some(128_974_848)),
            ("129e6", Some(129_000_000_000), Some(129_000_000)),
            ("123Mi", Some(123 * 1024 * 1024 * 1000), Some(123 << 20)),
            ("1k", Some(1_000_000), Some(1000)),
            ("0.1", Some(100), Some(1)),
            ("abc", None, None),
            ("", None, None),
        ] {
            assert_eq!(parse_milli(s), milli, "milli {s}");
            assert_eq!(parse_value(s), value, "value {s}");
        }
    }

    #[test]
    fn milli_values_print_as_canonical_quantities() {
        for (milli, decimal, binary) in [
            (0, "0", "0"),
            (500, "500m", "500m"),
            (1000, "1", "1"),
            (1500, "1500m", "1500m"),
            (2_000_000, "2k", "2000"),
            (123 * 1024 * 1024 * 1000, "128974848", "123Mi"),
            (1_000_000, "1k", "1k"),
            (1024 * 1000, "1024", "1Ki"),
        ] {
            assert_eq!(format_milli_decimal(milli), decimal, "decimal {milli}");
            assert_eq!(format_milli_binary(milli), binary, "binary {milli}");
        }
    }
}
