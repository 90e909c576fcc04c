//! Operations on whole trace files, each streaming and none loading a file into memory:
//! [`inspect`] summarises one (`kvtrace info`), [`convert`] moves it between `.lct`,
//! `.lct.zst` and lossless `.jsonl` (and migrates later schemas to schema 1), and [`synth`]
//! writes a realistic synthetic one (`kvtrace generate`).

pub mod convert;
pub mod inspect;
pub mod synth;
