//! Response handling for the `statestore` scenario: matching each response
//! to its request by Correlation Data, checking `__stat` and the RESP reply,
//! counting request PUBACKs, and acknowledging QoS 1 responses.

use bytes::{Buf, BytesMut};

use super::client::Client;
use std::sync::atomic::Ordering;

use super::stats::{OpStats, ANSWERED};
use super::Op;
use crate::common::{err_str, now_ns};
use crate::proto;

impl Client {
    /// Handles every complete packet in `buf`; PUBACKs owed go to `acks`.
    pub(super) fn handle(
        &mut self,
        buf: &mut BytesMut,
        acks: &mut Vec<u8>,
        st: &mut OpStats,
    ) -> Result<(), String> {
        while let Some((first, hl, rl)) = proto::frame(buf).map_err(|e| e.to_string())? {
            let body = &buf[hl..hl + rl];
            match first & 0xF0 {
                proto::PUBLISH => {
                    let p =
                        proto::parse_publish_rpc(first, body).map_err(|e| err_str("PUBLISH", e))?;
                    let now = now_ns();
                    if p.qos == 1 {
                        proto::encode_puback(acks, p.packet_id);
                    }
                    let entry = p
                        .correlation
                        .filter(|c| c.len() == 16 && c[8..12] == self.index.to_le_bytes())
                        .and_then(|c| {
                            let seq = u64::from_le_bytes(c[..8].try_into().unwrap_or_default());
                            self.outstanding.remove(&seq)
                        });
                    let Some((sent, op, answered)) = entry else {
                        st.unmatched += 1;
                        st.note(|| "response with unknown Correlation Data".into());
                        buf.advance(hl + rl);
                        continue;
                    };
                    let i = op as usize;
                    st.completed[i] += 1;
                    st.hist[i].saturating_record(now.saturating_sub(sent).max(1));
                    let total = ANSWERED.fetch_add(1, Ordering::Relaxed);
                    st.meanwhile
                        .saturating_record(total.saturating_sub(answered).max(1));
                    let pl = p.payload;
                    if p.status != Some(b"200") {
                        st.bad_status += 1;
                        let s = p.status.map(|s| String::from_utf8_lossy(s).into_owned());
                        st.note(|| format!("{op:?}: __stat {}", s.as_deref().unwrap_or("missing")));
                    } else if pl.first() == Some(&b'-') {
                        st.resp_errors += 1;
                        st.note(|| format!("{op:?}: {}", String::from_utf8_lossy(pl).trim_end()));
                    } else {
                        match op {
                            Op::Set if pl == b"+OK\r\n" => {}
                            Op::Get if pl == b"$-1\r\n" => st.misses += 1,
                            Op::Get if pl.first() == Some(&b'$') && pl.ends_with(b"\r\n") => {}
                            _ => {
                                st.unexpected += 1;
                                st.note(|| {
                                    format!(
                                        "{op:?}: unexpected reply {:?}",
                                        String::from_utf8_lossy(pl)
                                    )
                                });
                            }
                        }
                    }
                }
                proto::PUBACK => {
                    let (_, rc) = proto::parse_puback(body).map_err(|e| err_str("PUBACK", e))?;
                    self.pubacks_due = self.pubacks_due.saturating_sub(1);
                    if rc == 0x10 {
                        st.puback_no_subscribers += 1;
                    } else if rc >= 0x80 {
                        st.puback_failures += 1;
                        st.note(|| format!("PUBACK reason 0x{rc:02x}"));
                    }
                }
                proto::DISCONNECT => return Err(proto::describe_disconnect(self.version, body)),
                _ => {}
            }
            buf.advance(hl + rl);
        }
        Ok(())
    }
}
