//! A simulation ready to run: [`Setup`] holds its parts, each already checked by whoever
//! built it (the `kvtrace` binary builds it from Dynamo's `python -m dynamo.replay` flags and
//! kvtrace's KV offload), [`Plan::new`] checks how they combine, and [`Plan::run`] simulates
//! and writes the reports.

use std::path::PathBuf;

use super::args::{EngineType, EngineVersion};
use super::collector::Sla;
use super::event_loop::{simulate, SimConfig};
use super::lifecycle;
use super::offload::{Offload, OffloadConfig};
use super::report::SimulateReport;
use super::summary::PlayOutcome;
use super::workload::Workload;
use crate::bus::recorder::start_recording;
use crate::bus::{EventBus, SubscriberReport, Tracer};
use crate::error::{Error, Result};
use crate::storage::config::StorageConfig;
use crate::storage::{StorageManager, Traced};
use kvtrace_report::{Exporter, Target};

/// What a simulation runs with.
pub struct Setup {
    pub workload: Workload,
    pub config: SimConfig,
    pub sla: Sla,
    /// Add each request's inter-token latency and output rate to the summary.
    pub per_request_metrics: bool,
    /// KV offload through a shared StorageManager of this configuration.
    pub offload: Option<(StorageConfig, OffloadConfig)>,
    /// Record the offload's StorageManager calls as LMCT here.
    pub record: Option<PathBuf>,
    /// Where the JSON report goes (also when `outputs` writes nothing: the run names it).
    pub report_path: PathBuf,
    /// The report files, each checked writable before the run.
    pub outputs: Vec<(&'static dyn Exporter, Target)>,
    /// What the user should know before the run starts.
    pub warnings: Vec<String>,
}

/// A simulation whose parts run together, ready to start.
pub struct Plan(Setup);

/// A finished simulation.
pub struct Finished {
    pub report: SimulateReport,
    /// Where the JSON report went.
    pub report_path: PathBuf,
    /// What `record` wrote.
    pub recordings: Vec<SubscriberReport>,
}

impl Plan {
    /// The simulation `setup` describes; refused where its parts cannot run together.
    pub fn new(setup: Setup) -> Result<Plan> {
        if setup.config.online && setup.offload.is_some() {
            return Err(Error::usage(
                "KV offload runs offline only: its calls follow the simulated clock",
            ));
        }
        if setup.record.is_some() && setup.offload.is_none() {
            return Err(Error::usage("recording needs KV offload"));
        }
        if setup.offload.is_some() && setup.config.engine.engine_type == EngineType::Sglang {
            return Err(Error::usage(
                "KV offload models LMCache's vLLM connector: use it with the vllm engine, not sglang",
            ));
        }
        Ok(Plan(setup))
    }

    /// What the user should know before the run starts.
    pub fn warnings(&self) -> &[String] {
        &self.0.warnings
    }

    /// Requests the workload holds.
    pub fn request_count(&self) -> usize {
        self.0.workload.request_count()
    }

    /// Has `observer` hear each request as it ends.
    pub fn observe(&mut self, observer: std::sync::Arc<dyn crate::event_loop::RequestObserver>) {
        self.0.config.observer = Some(observer);
    }

    pub fn online(&self) -> bool {
        self.0.config.online
    }

    /// Simulates and writes the reports. `progress` hears the clock's milliseconds (virtual,
    /// or wall time online) and the requests done.
    pub fn run(self, progress: &mut dyn FnMut(f64, usize)) -> Result<Finished> {
        let Setup {
            workload,
            config,
            sla,
            per_request_metrics,
            offload,
            record,
            report_path,
            outputs,
            warnings: _,
        } = self.0;
        let mut offload = match offload {
            Some((storage, config)) => {
                let bus = record
                    .as_ref()
                    .map(|path| start_recording(path, &storage, true))
                    .transpose()?;
                let tracer = bus.as_ref().map_or_else(Tracer::disabled, EventBus::tracer);
                let sm = Traced::new(StorageManager::new(storage)?, tracer);
                Some((Offload::new(sm, config), bus))
            }
            None => None,
        };
        let connector = offload.as_mut().map(|(o, _)| o);
        let result = simulate(&workload, &config, connector, progress)?;
        let mut summary = result
            .collector
            .summary(result.provision, result.wall_ms, sla);
        if per_request_metrics {
            summary.per_request = Some(result.collector.per_request());
        }
        summary.interrupted = result.interrupted;
        summary.skipped = result.skipped;
        if config.engine.engine_version == EngineVersion::Aisimulate013 {
            let mut figures = result.collector.aisimulate_figures();
            if let Some(graph) = &workload.graph {
                figures.plays = result
                    .plays
                    .iter()
                    .zip(&graph.play_names)
                    .map(|(&end, name)| PlayOutcome {
                        play_id: name.clone(),
                        end,
                        failure_request_id: end.failure.and_then(|(s, _)| {
                            workload.sessions[s as usize]
                                .turns
                                .first()?
                                .request_id
                                .clone()
                        }),
                    })
                    .collect();
                let ids: Vec<&str> = workload
                    .sessions
                    .iter()
                    .map(|s| {
                        s.turns
                            .first()
                            .and_then(|t| t.request_id.as_deref())
                            .unwrap_or("")
                    })
                    .collect();
                figures.graph = graph.identity.clone();
                figures.lifecycle = Some((
                    result.lifecycle.len() as u64,
                    lifecycle::digest(&result.lifecycle, &graph.play_names, &ids),
                ));
            }
            summary.aisimulate = Some(figures);
        }
        let mut recordings = Vec::new();
        if let Some((store, bus)) = offload {
            summary.offload = Some(store.summary());
            drop(store);
            if let Some(bus) = bus {
                recordings = bus.close()?;
            }
        }
        let report = SimulateReport {
            summary,
            requests: result.collector.records,
        };
        for (exporter, target) in &outputs {
            kvtrace_report::write(&report, *exporter, target, "")?;
        }
        Ok(Finished {
            report,
            report_path,
            recordings,
        })
    }
}
