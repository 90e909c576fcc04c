use kvtrace::bus::recorder::{Recorder, RecorderOptions};
use kvtrace::bus::{BusOptions, EventBus, Subscriber};
use kvtrace::lmct::calls::StorageCall;
use kvtrace::lmct::codec::ObjectKey;
fn main() {
    let keys: Vec<ObjectKey> = (0..std::env::var("KEYS").map(|k| k.parse().unwrap()).unwrap_or(8u8)).map(|i| ObjectKey { chunk_hash: vec![i; 32], model_name: "meta-llama/Llama-3.1-8B".into(), kv_rank: 16777472, object_group_id: 0, cache_salt: String::new() }).collect();
    let t = std::time::Instant::now();
    let rec = Recorder::create(std::path::Path::new(&std::env::args().nth(1).unwrap()), RecorderOptions { zstd_level: std::env::args().nth(2).map(|l| l.parse().unwrap()), ..Default::default() }).unwrap();
    let subs: Vec<Box<dyn Subscriber>> = vec![Box::new(rec)];
    let bus = EventBus::start(BusOptions { capacity: std::env::var("CAP").map(|k| k.parse().unwrap()).unwrap_or(1 << 16), ..Default::default() }, subs).unwrap();
    let tr = bus.tracer();
    for _ in 0..1_000_000 { let c = StorageCall::FinishWrite { keys: &keys }; tr.publish_call(c.qualname(), |b| c.encode_args(b)); }
    let pub_t = t.elapsed();
    let r = bus.close().unwrap();
    println!("{:?} published in {:?}, total {:?}", r, pub_t, t.elapsed());
}
