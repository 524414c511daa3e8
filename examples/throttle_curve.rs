//! Draws docs/img/adaptive-throttling.svg: the fraction of requests the
//! client rejects locally against the fraction the server accepts, simulated
//! with the client's own throttle (freqcap::client::throttle::simulate), next
//! to the SRE book's steady state max(0, 1 − K·accepted).
//!
//! ```sh
//! cargo run --release --features client --example throttle_curve
//! ```

use freqcap::client::throttle::simulate;
use plotters::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "docs/img/adaptive-throttling.svg".into());
    let offered = 1000;
    let mut points = Vec::new();
    for pct in (0..=100).step_by(5) {
        let capacity = offered * pct / 100;
        points.push((f64::from(pct) / 100.0, simulate(offered, capacity, 2.0, 7)));
    }
    let root = SVGBackend::new(&out, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Client-side adaptive throttling (K = 2, 2-minute window)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..1f64, 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("fraction of sent requests the server can accept (capacity / offered)")
        .y_desc("fraction rejected locally")
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            (0..=100).map(|i| {
                let a = f64::from(i) / 100.0;
                (a, (1.0 - 2.0 * a).max(0.0))
            }),
            &BLUE,
        ))?
        .label("steady state max(0, 1 − 2·a)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(
            points
                .iter()
                .map(|&(a, p)| Circle::new((a, p), 4, RED.filled())),
        )?
        .label("simulated, 1 000 requests/s, seed 7")
        .legend(|(x, y)| Circle::new((x + 10, y), 4, RED.filled()));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;
    root.present()?;
    for (a, p) in &points {
        println!("{a:.2}\t{p:.3}");
    }
    println!("wrote {out}");
    Ok(())
}
