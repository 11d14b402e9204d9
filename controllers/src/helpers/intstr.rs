//! `intstr`: values that are an integer or a percentage (`maxSurge`, `maxUnavailable`,
//! `minAvailable`, ...), as apimachinery's `util/intstr` scales them.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// `intstr.GetScaledValueFromIntOrPercent`: an integer as is, `"N%"` of `total` rounded up or
/// down; any other string is an error.
pub fn scaled_value(v: &IntOrString, total: i32, round_up: bool) -> Result<i32, String> {
    match v {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let Some(num) = s.strip_suffix('%') else {
                return Err(format!(
                    "invalid value for IntOrString: invalid type: string {s:?} is not a percentage"
                ));
            };
            let pct: i64 = num
                .parse()
                .map_err(|e| format!("invalid value for IntOrString: invalid value {s:?}: {e}"))?;
            let exact = pct as f64 * f64::from(total) / 100.0;
            let v = if round_up {
                exact.ceil()
            } else {
                exact.floor()
            };
            Ok(v as i32)
        }
    }
}
