//! The one election order, used by the server to elect and by the SDK for its provisional view.

use core::cmp::Ordering;

use crate::protocol::{Member, ParticipantId};

/// Election order: server-assigned join sequence, then participant id, then session id.
pub fn election_cmp(a: &Member, b: &Member) -> Ordering {
    a.join_seq
        .cmp(&b.join_seq)
        .then_with(|| a.id.cmp(&b.id))
        .then_with(|| a.session.cmp(&b.session))
}

/// Sorts members into election order. The order is total (sessions are unique), so an unstable
/// sort gives the one result a stable sort would, with less code in the wasm.
pub fn sort_members(members: &mut [Member]) {
    members.sort_unstable_by(election_cmp);
}

/// The member the server elects among `members`: the first eligible one in election order.
/// `members` need not be sorted.
pub fn elect<'a>(members: impl IntoIterator<Item = &'a Member>) -> Option<&'a Member> {
    members
        .into_iter()
        .filter(|m| m.may_host)
        .min_by(|a, b| election_cmp(a, b))
}

/// The provisional coordinator while the server is unreachable: the last committed host if it is
/// still reachable, otherwise the member the election order picks among the reachable members of
/// the last committed membership. It carries no authority.
pub fn provisional_coordinator<'a>(
    last_host: Option<&'a ParticipantId>,
    members: &'a [Member],
    reachable: impl Fn(&ParticipantId) -> bool,
) -> Option<&'a ParticipantId> {
    if let Some(h) = last_host {
        if reachable(h) {
            return Some(h);
        }
    }
    elect(members.iter().filter(|m| reachable(&m.id))).map(|m| &m.id)
}
