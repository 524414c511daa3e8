//! Owner mode's users moving between live nodes (docs/cluster.md, "Owner
//! mode"): the fleet's tables of heavy users move users between members
//! that both stay, in either direction, every 30 s. A user moved from a
//! later joiner back to an earlier one must be decided on by its new
//! owner: its claim must not be fenced by the claim of the owner it had
//! meanwhile (before the fix, writes were fenced by the members' join
//! epochs, and such a user answered 503 until its record expired).

mod support;

use support::engines::{Fleet, Kind, SEC, commit, screen};

#[test]
fn users_moved_back_and_forth_by_the_tables_are_decided_by_each_new_owner() {
    let f = Fleet::new(Kind::Owned);
    f.campaign(
        "c",
        r#"{"caps": [{"kind": "window", "limit": 1000000, "window": "1d", "align": "calendar"}]}"#,
    );
    // Skewed load (u0 heaviest), so the tables place heavy users with
    // bounded loads, moving some between the two nodes at each table.
    let mut shown = [0u64; 32];
    let mut moved_home = 0;
    let mut owner_before: Vec<Option<String>> = vec![None; 32];
    for round in 0..240u64 {
        for u in 0..32usize {
            let user = format!("u{u}");
            for _ in 0..(32 / (u + 1)).max(1) {
                let (n, s) = f.screen(&user, &screen(&user, &["c"]));
                let id = s.reservation.expect("eligible");
                n.commit(&id, &commit("c")).expect("commits");
                shown[u] += 1;
            }
            let owner = f.owner_name(&user);
            if owner_before[u].as_deref().is_some_and(|b| b != owner) && owner == "n0" {
                moved_home += 1;
            }
            owner_before[u] = Some(owner);
        }
        let _ = round;
        f.advance(SEC);
    }
    // Every impression was counted where it was decided.
    for (u, n) in shown.iter().enumerate() {
        let user = format!("u{u}");
        let (node, _) = f.screen(&user, &screen(&user, &["c"]));
        assert_eq!(
            node.user_usage(&user, "c").expect("usage")[0].used,
            *n,
            "{user}"
        );
    }
    assert!(
        moved_home > 0,
        "the tables moved no user to the first joiner: the scenario did not happen"
    );
}
