//! A data writer's duties that do not depend on where it runs: its introduction (a certified
//! capsule's fresh writer first writes its own certificate), sealing a batch its queue gave
//! it ([`seal_batch`]) and its end-of-epoch record. The
//! runtime's writer actors and the simulator's inline writers both call these, so the records
//! they seal are built one way.

use crate::engine::queue::Taken;
use crate::window::Window;
use crate::LamportClock;
use psl_capsule::{Author, Body, ControlCode, KeyStatement, Link, Record, SealError};

/// A fresh writer's first record in a certified capsule: its own certificate, so that the log
/// carries every writer's key for servers, CapsuleDB and auditors. `None`: nothing to write (an
/// uncertified capsule, or a writer that has already written).
pub fn introduction(author: &mut Author, clock: &LamportClock) -> Option<Result<(Record, Body), SealError>> {
    if author.next_seq() != 0 {
        return None;
    }
    let sealed = author.write_own_cert()?;
    Some(sealed.map(|rec| {
        clock.observe(rec.header().lamport);
        (rec, own_cert_body(author))
    }))
}

/// The body of an own-certificate Cert record (what [`Author::write_own_cert`] carries).
fn own_cert_body(author: &Author) -> Body {
    Body::Certs(author.cert().cloned().map(KeyStatement::Cert).into_iter().collect())
}

/// The end-of-epoch record for `epoch`, linking `heads` (the first writer of a node carries its
/// view of every other writer's head; the others link nothing). Control records take their
/// Lamport time from the node's clock, like data: `at` is a time the caller ticked from
/// `clock` after every op stamped before it was sealed into this writer's chain. A runtime
/// whose puts stamp concurrently must tick `at` under the lock its puts stamp and queue under,
/// as it takes the queued ops; an op stamped before `at` but sealed after the EOE would take
/// the chain back in time.
pub fn end_of_epoch(
    author: &mut Author,
    clock: &LamportClock,
    at: u64,
    epoch: u64,
    heads: Vec<Link>,
) -> Result<(Record, Body), SealError> {
    let body = Body::Control { code: ControlCode::Eoe, payload: crate::node::epoch_payload(epoch) };
    author.observe(at);
    let rec = author.write_control(body.clone(), heads)?;
    clock.observe(rec.header().lamport);
    Ok((rec, body))
}

/// Seals the ops a queue gave ([`crate::engine::queue::WriterQueue::take`]: reserved in the
/// writer's flow `window`; an atomic batch as [`psl_capsule::Body::Atomic`]) into one data
/// record. The window tracks the record before the
/// caller can publish it, so its ack cannot come first; a batch that fails to seal is no longer
/// counted in flight (its ops stay applied locally only: they were checked against the
/// capsule's limits when admitted, so this is a bug the caller reports).
pub fn seal_batch(author: &mut Author, window: &Window, taken: Taken) -> Result<Record, SealError> {
    let Taken { ops, atomic, reserved } = taken;
    let sealed = if atomic { author.write_atomic(ops) } else { author.write_stamped(ops) };
    match sealed {
        Ok(rec) => {
            window.sealed(reserved, author.next_seq());
            Ok(rec)
        }
        Err(e) => {
            window.unseal(reserved);
            Err(e)
        }
    }
}
