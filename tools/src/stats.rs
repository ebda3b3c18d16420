//! Summaries of timing samples for the benchmarks: medians and spread
//! (p10/p90), ratios of medians, and paired differences of interleaved
//! runs.

use std::time::Duration;

/// Samples of one measured variant.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<f64>,
}

impl Samples {
    pub fn new() -> Samples {
        Samples::default()
    }

    pub fn push(&mut self, v: f64) {
        self.values.push(v);
    }

    pub fn push_duration(&mut self, d: Duration) {
        self.push(d.as_secs_f64() * 1e3);
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// The `p`-quantile (0..=1), linear interpolation between the closest
    /// ranks; NaN when empty.
    pub fn quantile(&self, p: f64) -> f64 {
        quantile(&self.values, p)
    }

    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }

    pub fn p10(&self) -> f64 {
        self.quantile(0.1)
    }

    pub fn p90(&self) -> f64 {
        self.quantile(0.9)
    }

    pub fn min(&self) -> f64 {
        self.values.iter().copied().fold(f64::NAN, f64::min)
    }

    pub fn max(&self) -> f64 {
        self.values.iter().copied().fold(f64::NAN, f64::max)
    }

    /// `median [p10–p90]` with `unit`, e.g. `4.21 ms [3.90–5.02]`.
    pub fn summary(&self, unit: &str) -> String {
        format!(
            "{} {unit} [{}–{}]",
            fmt_num(self.median()),
            fmt_num(self.p10()),
            fmt_num(self.p90())
        )
    }
}

fn quantile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = p.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let (Some(a), Some(b)) = (v.get(lo), v.get(hi)) else {
        return f64::NAN;
    };
    a + (b - a) * (pos - lo as f64)
}

/// Ratio of medians `a / b`.
pub fn ratio(a: &Samples, b: &Samples) -> f64 {
    a.median() / b.median()
}

/// Per-pair differences `a[i] - b[i]` of interleaved runs (pair `i` ran
/// back to back, so slow phases of the machine cancel out).
pub fn paired_differences(a: &Samples, b: &Samples) -> Samples {
    Samples {
        values: a.values.iter().zip(&b.values).map(|(x, y)| x - y).collect(),
    }
}

/// Three significant digits, without exponent for the ranges seen here.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[f64]) -> Samples {
        let mut x = Samples::new();
        for &i in v {
            x.push(i);
        }
        x
    }

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let x = s(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(x.median(), 3.0);
        assert_eq!(x.quantile(0.0), 1.0);
        assert_eq!(x.quantile(1.0), 5.0);
        assert!((x.p10() - 1.4).abs() < 1e-9);
        assert!((x.p90() - 4.6).abs() < 1e-9);
        assert_eq!(s(&[1.0, 2.0]).median(), 1.5);
        assert!(Samples::new().median().is_nan());
        assert_eq!(s(&[7.0]).p90(), 7.0);
    }

    #[test]
    fn ratios_and_pairs() {
        let a = s(&[10.0, 12.0, 11.0]);
        let b = s(&[5.0, 6.0, 5.5]);
        assert_eq!(ratio(&a, &b), 2.0);
        assert_eq!(paired_differences(&a, &b).values(), &[5.0, 6.0, 5.5]);
        assert_eq!(a.min(), 10.0);
        assert_eq!(a.max(), 12.0);
    }

    #[test]
    fn formats_three_digits() {
        assert_eq!(fmt_num(1234.4), "1234");
        assert_eq!(fmt_num(12.34), "12.3");
        assert_eq!(fmt_num(1.234), "1.23");
        assert_eq!(fmt_num(0.1234), "0.123");
        assert_eq!(fmt_num(f64::NAN), "n/a");
        assert_eq!(s(&[1.0, 2.0, 3.0]).summary("ms"), "2.00 ms [1.20–2.80]");
    }
}
