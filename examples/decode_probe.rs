use kvtrace::lmct::{ReadOptions, TraceReader};
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let t = std::time::Instant::now();
    let mut r = TraceReader::open(std::path::Path::new(&path), ReadOptions::default()).unwrap();
    let mut n = 0u64;
    while let Some(rec) = r.next_record().unwrap() { n += rec.args.len() as u64; }
    println!("{n} {:?}", t.elapsed());
}
