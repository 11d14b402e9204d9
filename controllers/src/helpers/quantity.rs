//! Resource quantities as apimachinery's `resource.Quantity` reads, adds, compares and prints
//! them: an exact value (here in nano units, the finest Kubernetes keeps) and the format its text
//! was written in (decimal SI `500m`/`2k`, binary SI `1Gi`, decimal exponent `1e3`). A sum keeps
//! the format of its first non-zero operand, as `Quantity.Add`; printing is the canonical form
//! (`1500m`, `2`, `1Gi`, `1536Mi`, `1k`), as `Quantity.String`. Quota usage keeps [`Quantity`]s;
//! the scheduler's request sums and the autoscaler's metrics use the plain numbers of
//! [`parse_milli`] / [`parse_value`] and print them back with [`format_milli_decimal`] /
//! [`format_milli_binary`], all through the same parser and printer.
//!
//! Owns quantity arithmetic only. Values finer than a nano unit round up (away from zero), as
//! upstream's parser does for the precision it keeps; values beyond ±1.7e29 are refused.

use std::fmt;

/// How a quantity prints (apimachinery's `resource.Format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// `m`, ``, `k`, `M`... (base 10, exponents in steps of 3).
    #[default]
    DecimalSi,
    /// `Ki`, `Mi`, `Gi`... (base 1024).
    BinarySi,
    /// `e3`, `E6`...
    DecimalExponent,
}

/// A quantity: an exact value in nano units and its format.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

const NANO: i128 = 1_000_000_000;

impl PartialEq for Quantity {
    /// Equal values are equal whatever their format (`Quantity.Cmp`).
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl Quantity {
    /// A whole number in decimal SI (`resource.NewQuantity(n, DecimalSI)`).
    pub fn from_int(n: i64) -> Quantity {
        Quantity {
            nanos: i128::from(n) * NANO,
            format: Format::DecimalSi,
        }
    }

    /// Zero in `format`.
    pub fn zero(format: Format) -> Quantity {
        Quantity { nanos: 0, format }
    }

    /// Its format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Whether it is zero.
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// Its value in milli units, rounded up away from zero (`MilliValue`).
    pub fn milli_value(&self) -> i128 {
        div_away_from_zero(self.nanos, 1_000_000)
    }

    /// Its value in whole units, rounded up away from zero (`Value`).
    pub fn value(&self) -> i128 {
        div_away_from_zero(self.nanos, NANO)
    }

    /// `milli` milli units in `format` (`resource.NewMilliQuantity`).
    pub fn from_milli(milli: i64, format: Format) -> Quantity {
        Quantity {
            nanos: i128::from(milli) * 1_000_000,
            format,
        }
    }

    /// Adds `other`; a zero sum so far takes `other`'s format (`Quantity.Add`).
    pub fn add(&mut self, other: &Quantity) {
        if self.nanos == 0 {
            self.format = other.format;
        }
        self.nanos += other.nanos;
    }

    /// Rounded up to a whole number (`RoundUp(0)`), keeping the format.
    pub fn round_up_whole(&self) -> Quantity {
        Quantity {
            nanos: div_ceil(self.nanos, NANO) * NANO,
            format: self.format,
        }
    }

    /// Reads Kubernetes' quantity syntax: `<sign><digits>[.<digits>]<suffix>`, the suffix one of
    /// the decimal SI (`n u m k M G T P E`), binary SI (`Ki`...`Ei`) or exponent (`e<n>`, `E<n>`)
    /// ones, or none.
    pub fn parse(text: &str) -> Result<Quantity, String> {
        let err = || format!("quantity {text:?} is not a Kubernetes quantity");
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(num_end);
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty() || frac.contains('.') {
            return Err(err());
        }
        // (base, exponent) of the suffix, and the format it implies.
        let (format, base, exp): (Format, i128, i32) = match suffix {
            "" => (Format::DecimalSi, 10, 0),
            "n" => (Format::DecimalSi, 10, -9),
            "u" => (Format::DecimalSi, 10, -6),
            "m" => (Format::DecimalSi, 10, -3),
            "k" => (Format::DecimalSi, 10, 3),
            "M" => (Format::DecimalSi, 10, 6),
            "G" => (Format::DecimalSi, 10, 9),
            "T" => (Format::DecimalSi, 10, 12),
            "P" => (Format::DecimalSi, 10, 15),
            "E" => (Format::DecimalSi, 10, 18),
            "Ki" => (Format::BinarySi, 1024, 1),
            "Mi" => (Format::BinarySi, 1024, 2),
            "Gi" => (Format::BinarySi, 1024, 3),
            "Ti" => (Format::BinarySi, 1024, 4),
            "Pi" => (Format::BinarySi, 1024, 5),
            "Ei" => (Format::BinarySi, 1024, 6),
            other if other.starts_with(['e', 'E']) => {
                let e: i32 = other[1..].parse().map_err(|_| err())?;
                (Format::DecimalExponent, 10, e)
            }
            _ => return Err(err()),
        };
        // The digits as an integer with `scale` decimal places.
        let digits = format!("{whole}{frac}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 36 {
            return Err(err());
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| err())?
        };
        let scale = frac.len() as i32;
        // value = mantissa * base^exp / 10^scale, in nanos: * 10^9.
        let (mut num, mut den) = (mantissa, 1i128);
        let mul = |n: &mut i128, f: i128, times: i32| -> Result<(), String> {
            for _ in 0..times {
                *n = n.checked_mul(f).ok_or_else(err)?;
            }
            Ok(())
        };
        if exp >= 0 {
            mul(&mut num, base, exp)?;
        } else {
            mul(&mut den, base, -exp)?;
        }
        mul(&mut den, 10, scale)?;
        mul(&mut num, 10, 9)?;
        let nanos = div_ceil(num, den);
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
            format,
        })
    }
}

/// `n / d` for a positive `d`, a fractional quotient rounded away from zero (as upstream's
/// scaling of an amount rounds).
fn div_away_from_zero(n: i128, d: i128) -> i128 {
    let q = n / d;
    match n % d {
        0 => q,
        _ if n > 0 => q + 1,
        _ => q - 1,
    }
}

fn div_ceil(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d != 0 && ((n > 0) == (d > 0)) {
        q + 1
    } else {
        q
    }
}

impl fmt::Display for Quantity {
    /// The canonical form (`Quantity.String`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let mut format = self.format;
        if format == Format::BinarySi && (self.nanos.abs() < 1024 * NANO || self.nanos % NANO != 0)
        {
            // Small or fractional binary values print in decimal SI, as upstream.
            format = Format::DecimalSi;
        }
        if format == Format::BinarySi {
            let mut amount = self.nanos / NANO;
            let mut exp = 0;
            while amount % 1024 == 0 && exp < 6 {
                amount /= 1024;
                exp += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp];
            return write!(f, "{amount}{suffix}");
        }
        let mut amount = self.nanos;
        let mut exp: i32 = -9;
        while amount % 10 == 0 {
            amount /= 10;
            exp += 1;
        }
        match exp.rem_euclid(3) {
            1 => {
                amount *= 10;
                exp -= 1;
            }
            2 => {
                amount *= 100;
                exp -= 2;
            }
            _ => {}
        }
        let suffix = match (format, exp) {
            (_, 0) => String::new(),
            (Format::DecimalSi, -9) => "n".into(),
            (Format::DecimalSi, -6) => "u".into(),
            (Format::DecimalSi, -3) => "m".into(),
            (Format::DecimalSi, 3) => "k".into(),
            (Format::DecimalSi, 6) => "M".into(),
            (Format::DecimalSi, 9) => "G".into(),
            (Format::DecimalSi, 12) => "T".into(),
            (Format::DecimalSi, 15) => "P".into(),
            (Format::DecimalSi, 18) => "E".into(),
            (_, e) => format!("e{e}"),
        };
        write!(f, "{amount}{suffix}")
    }
}

/// A Quantity in milli-units (CPU), rounded up away from zero (`MilliValue`); None when it does
/// not parse or does not fit an i64.
pub fn parse_milli(s: &str) -> Option<i64> {
    i64::try_from(Quantity::parse(s).ok()?.milli_value()).ok()
}

/// A Quantity in units (bytes, counts), rounded up away from zero (`Value`); None when it does not
/// parse or does not fit an i64.
pub fn parse_value(s: &str) -> Option<i64> {
    i64::try_from(Quantity::parse(s).ok()?.value()).ok()
}

/// A milli-value as the canonical decimal Quantity `resource.NewMilliQuantity(v, DecimalSI)`
/// prints: the largest of m, (none), k, M, G, T, P, E that keeps the number whole ("500m", "1",
/// "1500m", "2k").
pub fn format_milli_decimal(milli: i64) -> String {
    Quantity::from_milli(milli, Format::DecimalSi).to_string()
}

/// A milli-value as `resource.NewMilliQuantity(v, BinarySI)` prints: a whole number of units
/// with the largest power-of-1024 suffix that keeps it whole ("123Mi", "2000"); below 1024 units
/// or with a fractional part, the decimal form ("1k", "1500m"), as `CanonicalizeBytes` does.
pub fn format_milli_binary(milli: i64) -> String {
    Quantity::from_milli(milli, Format::BinarySi).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(s: &str) -> String {
        Quantity::parse(s).unwrap().to_string()
    }

    #[test]
    fn prints_the_canonical_form_upstream_prints() {
        for (input, want) in [
            ("0", "0"),
            ("0Gi", "0"),
            ("100m", "100m"),
            ("1500m", "1500m"),
            ("2000m", "2"),
            ("0.5", "500m"),
            ("1.5", "1500m"),
            ("1000", "1k"),
            ("1500", "1500"),
            ("12e6", "12e6"),
            ("1Gi", "1Gi"),
            ("1024Mi", "1Gi"),
            ("1536Mi", "1536Mi"),
            ("512Ki", "512Ki"),
            ("1024", "1024"),
            ("1Ki", "1Ki"),
            ("0.5Gi", "512Mi"),
            ("500M", "500M"),
            ("1G", "1G"),
            ("1n", "1n"),
            ("10u", "10u"),
            ("-100m", "-100m"),
        ] {
            assert_eq!(canonical(input), want, "{input}");
        }
    }

    #[test]
    fn a_sum_takes_the_format_of_its_first_non_zero_operand() {
        let mut sum = Quantity::zero(Format::DecimalSi);
        sum.add(&Quantity::parse("1Gi").unwrap());
        sum.add(&Quantity::parse("1G").unwrap());
        // 1Gi + 1G = 2073741824 bytes, binary but not a multiple of 1024.
        assert_eq!(sum.format(), Format::BinarySi);
        assert_eq!(sum.to_string(), "2073741824");
        sum.add(&Quantity::parse("-1G").unwrap());
        assert_eq!(sum.to_string(), "1Gi");
        let mut sum = Quantity::parse("100m").unwrap();
        sum.add(&Quantity::parse("900m").unwrap());
        assert_eq!(sum.to_string(), "1");
        assert_eq!(
            Quantity::parse("1").unwrap(),
            Quantity::parse("1000m").unwrap()
        );
    }

    #[test]
    fn rounds_up_to_whole_units_and_refuses_nonsense() {
        assert_eq!(
            Quantity::parse("1500m")
                .unwrap()
                .round_up_whole()
                .to_string(),
            "2"
        );
        assert_eq!(Quantity::parse("0.1n").unwrap().to_string(), "1n");
        for bad in ["", "abc", "1.2.3", "1Xi", "1e", "--1"] {
            assert!(Quantity::parse(bad).is_err(), "{bad}");
        }
    }

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
