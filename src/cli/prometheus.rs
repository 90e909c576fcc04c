//! `--prometheus-port` and its companions, turned into a live metrics endpoint.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use kvtrace::error::{short, Error};
use kvtrace::metrics::{Endpoint, Live};
use kvtrace::otel::{SpanSink, SpanTee};
use kvtrace::rank::Rank;

#[derive(clap::Args, Clone)]
pub(crate) struct PrometheusArgs {
    /// Serve the run's live figures (requests, hit tokens and rate per tier, fidelity, calls,
    /// tiers, progress) at http://HOST:PORT/metrics for Prometheus; in rank mode each rank
    /// serves PORT + its rank
    #[arg(long, value_name = "PORT", help_heading = "Prometheus")]
    prometheus_port: Option<u16>,
    /// The address the endpoint listens on
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "0.0.0.0",
        requires = "prometheus_port",
        help_heading = "Prometheus"
    )]
    prometheus_host: IpAddr,
    /// Keep serving the final figures this many seconds after the run, so that a scrape
    /// sees them
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 0.0,
        requires = "prometheus_port",
        help_heading = "Prometheus"
    )]
    prometheus_hold: f64,
}

/// A run's endpoint while it lasts.
pub(crate) struct Served {
    pub(crate) live: Arc<Live>,
    endpoint: Endpoint,
    hold: Duration,
}

impl PrometheusArgs {
    pub(crate) fn asked(&self) -> bool {
        self.prometheus_port.is_some()
    }

    /// The endpoint these flags ask for, serving the figures of a `command` run over `trace`;
    /// `None` when none is asked.
    pub(crate) fn start(
        &self,
        command: &str,
        trace: &str,
        rank: Option<&Rank>,
    ) -> Result<Option<Served>, Error> {
        let Some(port) = self.prometheus_port else {
            return Ok(None);
        };
        let hold = Duration::try_from_secs_f64(self.prometheus_hold).map_err(|_| {
            Error::usage(format!(
                "--prometheus-hold {}: expected seconds, 0 or more",
                short(self.prometheus_hold)
            ))
        })?;
        let port = match (port, rank) {
            (0, _) | (_, None) => Some(port),
            (port, Some(r)) => u16::try_from(u32::from(port) + r.rank).ok(),
        }
        .ok_or_else(|| {
            Error::usage(format!(
                "--prometheus-port {port}: port plus the rank is past 65535"
            ))
        })?;
        let rank_label = rank.map(|r| r.rank.to_string()).unwrap_or_default();
        let live = Live::new(command, trace, &rank_label);
        let endpoint = Endpoint::start(SocketAddr::new(self.prometheus_host, port), live.clone())
            .map_err(|e| Error {
            message: format!("--prometheus-port: {}", e.message),
            ..e
        })?;
        Ok(Some(Served {
            live,
            endpoint,
            hold,
        }))
    }
}

/// Where a run's request span trees go: the live figures, the OTLP export, both, or nowhere.
pub(crate) fn span_sink(
    served: Option<&Served>,
    export: Option<Arc<dyn SpanSink>>,
) -> Option<Arc<dyn SpanSink>> {
    let live = served.map(|s| s.live.clone() as Arc<dyn SpanSink>);
    match (live, export) {
        (Some(live), Some(export)) => Some(Arc::new(SpanTee(vec![export, live]))),
        (live, export) => live.or(export),
    }
}

impl Served {
    /// Serves the final figures for the hold, then stops.
    pub(crate) fn finish(self, quiet: bool) {
        self.live.finish();
        if !self.hold.is_zero() {
            if !quiet {
                eprintln!(
                    "kvtrace: serving the final figures at http://{}/metrics for {:.0} s",
                    self.endpoint.addr(),
                    self.hold.as_secs_f64()
                );
            }
            std::thread::sleep(self.hold);
        }
    }
}
