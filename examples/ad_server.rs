//! An ad server's loop over freqcap::client (docs/clients.md): for each ad
//! request, screen the candidate campaigns for the user (reserving what is
//! eligible), run the auction, commit the winner (the other candidates are
//! released by the commit) or release everything when nothing won.
//!
//! ```sh
//! freqcap serve --memory &            # or make run
//! cargo run --release --features client --example ad_server -- http://127.0.0.1:8080
//! ```

use std::time::Duration;

use freqcap::client::{Builder, Commit, FailMode, Screen};
use freqcap::model::from_json;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes: Vec<String> = std::env::args().skip(1).collect();
    let nodes = if nodes.is_empty() {
        vec!["http://127.0.0.1:8080".to_owned()]
    } else {
        nodes
    };
    // An ad server has ~10 ms for freqcap; past it, serve without capping
    // rather than lose the impression (fail open).
    let client = Builder::new(nodes)
        .deadline(Duration::from_millis(10))
        .fail(FailMode::Open)
        .build()?;
    // Five campaigns: 3 impressions per user per day, 1 000 a day in all.
    let campaigns: Vec<String> = (0..5).map(|i| format!("example-c{i}")).collect();
    for c in &campaigns {
        let def = from_json(
            r#"{"caps": [{"kind": "window", "limit": 3, "window": "1d", "align": "calendar", "name": "daily-per-user"}],
                "budget": {"amount": 1000, "pacing": "asap"}}"#,
        )?;
        // Definitions are not latency-bound: a longer deadline through a
        // client of their own.
        Builder::new(["http://127.0.0.1:8080"])
            .deadline(Duration::from_secs(2))
            .build()?
            .put_campaign(c, &def)
            .await?;
    }
    let (mut served, mut none, mut open) = (0, 0, 0);
    for request in 0..200u32 {
        let user = format!("user-{}", request % 40);
        let screened = client
            .screen(&Screen::new(user.clone(), campaigns.iter().cloned()).reserve(Some(1000)))
            .await?;
        if screened.failed_open {
            open += 1;
        }
        // The auction: here, the first eligible candidate wins.
        let winner = screened.results.iter().find(|r| r.eligible);
        match (winner, screened.reservation) {
            (Some(w), Some(res)) => {
                client
                    .commit(
                        &res,
                        &Commit {
                            campaign: Some(vec![w.campaign.clone()]),
                            user: Some(user),
                            ..Commit::default()
                        },
                    )
                    .await?;
                served += 1;
            }
            (None, Some(res)) => {
                client.release(&res, Some(&user)).await?;
                none += 1;
            }
            _ => none += 1,
        }
    }
    println!("served {served}, nothing eligible {none}, failed open {open}");
    if let Some(f) = client.throttle_figures() {
        println!("adaptive throttling: {f:?}");
    }
    Ok(())
}
