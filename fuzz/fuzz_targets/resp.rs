#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| statehub_fuzz_checks::resp(data));
