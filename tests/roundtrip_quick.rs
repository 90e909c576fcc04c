use kvtrace::lmct::*;
#[test]
fn quick() {
    for f in ["basic_lru", "empty_arc", "unknown_qualname", "basic_lru.truncated"] {
        let bytes = std::fs::read(format!("testdata/lmcache/{f}.lct")).unwrap();
        let mut r = TraceReader::open(std::path::Path::new(&format!("testdata/lmcache/{f}.lct")), ReadOptions::default()).unwrap();
        let mut out = Vec::new();
        r.header().encode(&mut out);
        assert_eq!(&out[..], &bytes[4..4+out.len()], "{f} header");
        let mut n = 0;
        while let Some(rec) = r.next_record().unwrap() {
            let mut o = Vec::new();
            rec.to_record().encode(&mut o);
            assert_eq!(o, rec.body);
            n += 1;
        }
        println!("{f}: {n} records {:?} digest ok {}", r.summary().warnings(), digest::config_digest(&r.header().sm_config_json) == r.header().sm_config_digest);
        let v: serde_json::Value = serde_json::from_str(&r.header().sm_config_json).unwrap();
        assert_eq!(digest::python_json(&v), r.header().sm_config_json);
    }
}
