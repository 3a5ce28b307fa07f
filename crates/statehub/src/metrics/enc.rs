//! One call per metric family, over prometheus-client's descriptor encoder.

use std::fmt::Error;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use statehub_stats::HistogramSnapshot;

/// The encoder, with one call per metric family.
pub(super) struct Enc<'a>(pub(super) DescriptorEncoder<'a>);

impl Enc<'_> {
    /// A counter of whole (`u64`) or fractional (`f64`, seconds) amounts.
    pub(super) fn counter<V: EncodeCounterValue>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        v: V,
    ) -> Result<(), Error> {
        self.0
            .encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?
            .encode_counter::<NoLabelSet, _, u64>(&v, None)
    }

    /// A gauge of whole (`u64`) or fractional (`f64`, seconds) amounts.
    pub(super) fn gauge<V: EncodeGaugeValue>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        v: V,
    ) -> Result<(), Error> {
        self.0
            .encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?
            .encode_gauge(&v)
    }

    pub(super) fn counters<const N: usize>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        keys: &[&str; N],
        values: &[([&str; N], u64)],
    ) -> Result<(), Error> {
        let mut family =
            self.0
                .encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
        for (labels, v) in values {
            let set: Vec<(&str, &str)> = keys.iter().copied().zip(labels.iter().copied()).collect();
            family
                .encode_family(&set)?
                .encode_counter::<NoLabelSet, _, u64>(v, None)?;
        }
        Ok(())
    }

    pub(super) fn gauges<const N: usize>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        keys: &[&str; N],
        values: &[([&str; N], u64)],
    ) -> Result<(), Error> {
        let mut family = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
        for (labels, v) in values {
            let set: Vec<(&str, &str)> = keys.iter().copied().zip(labels.iter().copied()).collect();
            family.encode_family(&set)?.encode_gauge(v)?;
        }
        Ok(())
    }

    pub(super) fn histogram(
        &mut self,
        name: &str,
        help: &str,
        h: &HistogramSnapshot,
    ) -> Result<(), Error> {
        self.0
            .encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?
            .encode_histogram::<NoLabelSet>(h.sum_secs, h.count, &h.buckets, None)
    }
}
