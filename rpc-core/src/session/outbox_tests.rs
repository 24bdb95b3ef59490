//! The outbox's rules with a fake body: order, one answer per call, the size limit, and what
//! leaving means for the session.

use super::super::{Role, Session, SessionParams};
use super::*;
use crate::status::Code;

/// A body: its header, length, and bytes posted so far.
#[derive(Debug, PartialEq)]
struct Fake(Header, usize, usize);

impl Queued for Fake {
    fn header(&self) -> &Header {
        &self.0
    }
    fn body_len(&self) -> usize {
        self.1
    }
    fn untouched(&self) -> bool {
        self.2 == 0
    }
}

fn session(role: Role) -> Session {
    Session::new(
        role,
        SessionParams {
            id: 5,
            credits: 4,
            eager_threshold: 16,
            max_message: 1000,
            peer_ring_len: 1024,
            own_ring_len: 1024,
            max_held: 4,
        },
    )
}

fn request(slot: u16) -> Header {
    Header { method: 1, session: 5, slot, generation: 1, ..Header::new(Kind::Request) }
}

fn answer(slot: u16) -> Header {
    Header { slot, generation: 1, ..Header::new(Kind::Response) }
}

/// Answers leave in the order queued; posting one whole returns its call's credit; a second
/// answer to the same call is taken out as late, never sent, even behind other answers.
#[test]
fn answers_leave_in_order_once_per_call() {
    let mut s = session(Role::Server);
    for slot in 0..2 {
        s.handle_header(&request(slot), std::time::Instant::now).unwrap();
    }
    let mut o: Outbox<Fake> = Outbox::default();
    assert!(o.is_empty(), "empty: a new answer may go straight out");
    o.push(Waiting::Body(Fake(answer(1), 10, 0)));
    o.push(Waiting::Error(answer(0), Status::internal("x")));
    o.push(Waiting::Body(Fake(answer(1), 10, 0)));
    assert!(o.holds(0, 1) && !o.holds(2, 1));
    match o.front(&s) {
        Some(Front::Send(Waiting::Body(b))) => {
            assert_eq!(b.0.slot, 1);
            b.2 = 4; // a first piece posted: still at the front
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(o.front(&s), Some(Front::Send(Waiting::Body(Fake(h, _, 4)))) if h.slot == 1));
    assert!(s.is_unanswered(1, 1));
    assert!(o.sent(&mut s).is_some());
    assert!(!s.is_unanswered(1, 1), "posted whole: its credit returns");
    assert!(matches!(o.front(&s), Some(Front::Send(Waiting::Error(h, _))) if h.slot == 0));
    o.sent(&mut s);
    assert_eq!(s.unanswered(), 0);
    assert!(matches!(o.front(&s), Some(Front::Late(Waiting::Body(Fake(h, _, 0)))) if h.slot == 1));
    assert!(o.front(&s).is_none() && o.is_empty());
}

/// A body over `max_message_size` is replaced by RESOURCE_EXHAUSTED naming the limit, which is
/// sent in its place.
#[test]
fn a_body_over_the_limit_becomes_its_error_answer() {
    let mut s = session(Role::Server);
    s.handle_header(&request(0), std::time::Instant::now).unwrap();
    let mut o: Outbox<Fake> = Outbox::default();
    o.push(Waiting::Body(Fake(answer(0), 1001, 0)));
    assert!(matches!(o.front(&s), Some(Front::Refused(Fake(_, 1001, _)))));
    match o.front(&s) {
        Some(Front::Send(Waiting::Error(h, st))) => {
            assert_eq!((h.slot, st.code()), (0, Code::ResourceExhausted));
            assert!(st.message().contains("max_message_size"), "{}", st.message());
        }
        other => panic!("{other:?}"),
    }
}

/// A request abandoned while its body was leaving gets its Cancel only once its last piece is
/// posted; a request not abandoned gets none.
#[test]
fn a_request_abandoned_while_leaving_cancels_after_its_last_piece() {
    let mut c = session(Role::Client);
    let a = c.start_call(1, None, 0).unwrap();
    let b = c.start_call(1, None, 0).unwrap();
    let ha = c.next_request(std::time::Instant::now).unwrap();
    let hb = c.next_request(std::time::Instant::now).unwrap();
    let mut o: Outbox<Fake> = Outbox::default();
    o.push(Waiting::Body(Fake(ha, 500, 0)));
    o.push(Waiting::Body(Fake(hb, 500, 0)));
    let leaving = o.holds(a.0, a.1);
    c.abandon_call(a.0, a.1, leaving, std::time::Instant::now);
    assert!(!c.has_control(), "its pieces are still leaving");
    o.sent(&mut c);
    assert_eq!(c.next_control(), Some(Header { slot: a.0, generation: a.1, ..Header::new(Kind::Cancel) }));
    o.sent(&mut c);
    assert!(!c.has_control(), "{b:?} was not abandoned: no Cancel");
}

/// A Cancel's event means a CANCELLED answer for its call, which returns its credit when
/// posted; a later answer from its handler is then late. A session-ending event has no answer.
#[test]
fn a_cancelled_call_is_answered_cancelled_once() {
    let mut s = session(Role::Server);
    s.handle_header(&request(2), std::time::Instant::now).unwrap();
    let cancel = Header { session: 5, slot: 2, generation: 1, ..Header::new(Kind::Cancel) };
    s.handle_header(&cancel, std::time::Instant::now).unwrap();
    let (h, st) = s.poll_event().and_then(|e| e.answer()).expect("a call-ending event");
    assert_eq!((h.kind, h.slot, h.generation, st.code()), (Kind::Response, 2, 1, Code::Cancelled));
    let mut o: Outbox<Fake> = Outbox::default();
    o.push(Waiting::Error(h, st));
    o.push(Waiting::Body(Fake(answer(2), 8, 0)));
    assert!(matches!(o.front(&s), Some(Front::Send(Waiting::Error(..)))));
    o.sent(&mut s);
    assert_eq!(s.unanswered(), 0);
    assert!(matches!(o.front(&s), Some(Front::Late(_))), "the handler's answer came too late");
    let dead = super::super::Event::PeerDead { silent: std::time::Duration::from_secs(1) };
    assert!(dead.answer().is_none());
}

fn stream_msg(slot: u16, len: usize) -> Fake {
    Fake(Header { slot, generation: 1, ..Header::new(Kind::StreamMsg) }, len, 0)
}

/// A stream message that can never leave fails its stream: it and the stream's other waiting
/// messages are taken out, another call's messages stay in order, and the stream's answer
/// goes as the status when it waits already; when none waits the driver is told to end the
/// stream. Anything else at the front is left alone.
#[test]
fn a_stream_message_that_cannot_leave_fails_its_stream() {
    let failed = || Status::resource_exhausted("send mirror");
    let mut o: Outbox<Fake> = Outbox::default();
    o.push(Waiting::Body(stream_msg(0, 100)));
    o.push(Waiting::Body(Fake(answer(1), 10, 0)));
    o.push(Waiting::Body(stream_msg(0, 5)));
    o.push(Waiting::Body(Fake(answer(0), 0, 0)));
    let (taken, end) = o.fail_stream(failed());
    assert_eq!(
        taken.iter().map(|b| (b.0.kind, b.1)).collect::<Vec<_>>(),
        [(Kind::StreamMsg, 100), (Kind::StreamMsg, 5), (Kind::Response, 0)]
    );
    assert!(end.is_none(), "its answer waits: it carries the status");
    let left: Vec<_> = o.drain().map(|m| (*m.header(), matches!(m, Waiting::Error(..)))).collect();
    assert_eq!(
        left.iter().map(|(h, e)| (h.slot, h.kind, *e)).collect::<Vec<_>>(),
        [(1, Kind::Response, false), (0, Kind::Response, true)]
    );

    // No answer waits: the driver ends the stream.
    o.push(Waiting::Body(stream_msg(2, 100)));
    o.push(Waiting::Body(Fake(answer(1), 10, 0)));
    let (taken, end) = o.fail_stream(failed());
    assert_eq!(taken.len(), 1);
    assert_eq!(end.map(|s| s.code()), Some(Code::ResourceExhausted));
    assert_eq!(o.len(), 1);

    // An answer, or a message partly posted, at the front: nothing happens.
    let (taken, end) = o.fail_stream(failed());
    assert!(taken.is_empty() && end.is_none() && o.len() == 1);
    o.drain().for_each(drop);
    o.push(Waiting::Body(Fake(stream_msg(3, 100).0, 100, 40)));
    let (taken, end) = o.fail_stream(failed());
    assert!(taken.is_empty() && end.is_none() && o.len() == 1);
}
