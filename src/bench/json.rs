//! The benches' JSON lines, written with serde: numbers rounded to the decimals each line has
//! always had ([`Fixed`], [`fixed`]), whole numbers ([`Whole`]), maps in a given order
//! ([`InOrder`]), and memory samples ([`MemorySamples`]).
//!
//! A rounded number is written in its shortest form: `2.5`, not `2.500`; the value is the one
//! `format!("{x:.3}")` gives. A number that is not finite is written `null`.

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

/// `x` rounded to `decimals` places, exactly as `format!("{x:.decimals$}")` rounds it.
pub fn round(x: f64, decimals: usize) -> f64 {
    if !x.is_finite() {
        return x;
    }
    format!("{x:.decimals$}").parse().unwrap_or(x)
}

/// A number written to `D` decimal places.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fixed<const D: usize>(pub f64);

impl<const D: usize> Serialize for Fixed<D> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(round(self.0, D))
    }
}

/// `#[serde(serialize_with = "fixed::<D, _>")]`: a number field written to `D` decimal places.
pub fn fixed<const D: usize, S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    Fixed::<D>(*x).serialize(s)
}

/// `#[serde(serialize_with = "fixed_opt::<D, _>")]`: an optional number, `null` when `None`.
pub fn fixed_opt<const D: usize, S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    x.map(Fixed::<D>).serialize(s)
}

/// A number written as a whole number (rounded; `null` when not finite).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Whole(pub f64);

impl Serialize for Whole {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.is_finite() {
            true => s.serialize_i64(self.0.round() as i64),
            false => s.serialize_none(),
        }
    }
}

/// A JSON object with these keys in this order (a `serde_json::Map` sorts its keys).
#[derive(Debug, Clone, PartialEq)]
pub struct InOrder<K, V>(pub Vec<(K, V)>);

impl<K: Serialize, V: Serialize> Serialize for InOrder<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<K, V> FromIterator<(K, V)> for InOrder<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        InOrder(iter.into_iter().collect())
    }
}

/// Memory sampled during a run, for the leak checks: `{"samples":[[when, MB], ...], "first",
/// "last", "max"}`, MB to 0.1. `when` is a frame index or a time, as the caller counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemorySamples<T> {
    pub samples: Vec<(T, Fixed<1>)>,
    pub first: Fixed<1>,
    pub last: Fixed<1>,
    pub max: Fixed<1>,
}

impl<T: Clone> MemorySamples<T> {
    /// `None` (`null` in the JSON) without samples.
    pub fn of(samples: &[(T, f64)]) -> Option<MemorySamples<T>> {
        let (first, last) = (samples.first()?, samples.last()?);
        Some(MemorySamples {
            samples: samples.iter().map(|(w, v)| (w.clone(), Fixed(*v))).collect(),
            first: Fixed(first.1),
            last: Fixed(last.1),
            max: Fixed(samples.iter().map(|s| s.1).fold(f64::MIN, f64::max)),
        })
    }
}

/// A row with `"bench": NAME` before its own fields.
#[derive(Debug, Clone, Serialize)]
pub struct Tagged<'a, T: Serialize> {
    pub bench: &'static str,
    #[serde(flatten)]
    pub row: &'a T,
}

/// `v` as one line of JSON. The benches' rows have string keys only, so this cannot fail.
pub fn line<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("a bench row is plain JSON (string keys)")
}

/// Test helper: `text` parsed as one JSON object whose keys are `keys`, in that order (checked on
/// the text: a `serde_json::Value` need not keep it).
#[cfg(test)]
pub(crate) fn parse_row(text: &str, keys: &[&str]) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let mut got: Vec<String> = v.as_object().unwrap_or_else(|| panic!("not an object: {text}")).keys().cloned().collect();
    let mut want: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "{text}");
    let mut at = 0;
    for k in keys {
        let i = text[at..].find(&format!("\"{k}\":")).unwrap_or_else(|| panic!("`{k}` out of order: {text}"));
        at += i + k.len() + 3;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_as_the_format_did() {
        for (x, d) in [(2.0, 3), (1.23456, 4), (0.1 + 0.2, 2), (1427.55, 1), (12.0, 0), (-0.00001, 3), (1e-9, 4)] {
            let want: f64 = format!("{x:.d$}").parse().unwrap();
            assert_eq!(round(x, d), want, "{x} to {d}");
        }
        assert_eq!(line(&Fixed::<3>(2.0)), "2.0");
        assert_eq!(line(&Fixed::<4>(0.123456)), "0.1235");
        assert_eq!(line(&Fixed::<2>(f64::NAN)), "null");
        assert_eq!(line(&Whole(499.6)), "500");
        assert_eq!(line(&Whole(f64::INFINITY)), "null");
    }

    #[test]
    fn maps_keep_their_order() {
        let m: InOrder<&str, Fixed<3>> = [("b", Fixed(2.0)), ("a", Fixed(20.0))].into_iter().collect();
        assert_eq!(line(&m), r#"{"b":2.0,"a":20.0}"#);
    }

    #[test]
    fn memory_samples_report_first_last_max() {
        assert_eq!(MemorySamples::<usize>::of(&[]), None);
        assert_eq!(line(&MemorySamples::<usize>::of(&[])), "null");
        let j = line(&MemorySamples::of(&[(0, 10.0), (50, 12.54), (99, 11.0)]));
        assert_eq!(j, r#"{"samples":[[0,10.0],[50,12.5],[99,11.0]],"first":10.0,"last":11.0,"max":12.5}"#);
        let v: serde_json::Value = serde_json::from_str(&line(&MemorySamples::of(&[(0.3, 1394.0), (1.3, 1427.6)]))).unwrap();
        assert_eq!((v["samples"][1][0].as_f64(), v["first"].as_f64(), v["last"].as_f64(), v["max"].as_f64()), (Some(1.3), Some(1394.0), Some(1427.6), Some(1427.6)));
    }
}
