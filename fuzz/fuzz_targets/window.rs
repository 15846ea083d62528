//! AKS maintenance windows (`maintenance.kubernetes` / `nodeOS`): the JSON read into the wire
//! shape, validated, then the next openings computed from a few fixed instants. Never panics;
//! errors name their field; the wire form survives a round trip; and `next_opening`, `is_open`
//! and `is_schedule_date` agree: an opening starts at or after the instant asked about, work
//! may start at each of its instants and at none between the instant and the opening, and work
//! may start exactly when an instance on a schedule date holds the instant and no not-allowed
//! local day does.

#![no_main]

use libfuzzer_sys::fuzz_target;

use flotilla_engine::error::from_json_value;
use flotilla_engine::time::{Date, SECONDS_PER_DAY, Time};
use flotilla_engine::window::{MaintenanceWindow, MaintenanceWindowSpec, Opening};
use flotilla_fuzz::{check_error, request_json};

const ROOT: &str = "maintenance.kubernetes";

/// Whether work may start at `t`, from the schedule-date predicate and the wire form's
/// not-allowed dates alone.
fn oracle(w: &MaintenanceWindow, t: Time) -> bool {
    let (today, _) = t.civil(w.utc_offset);
    let in_instance = [today.days() - 1, today.days()].into_iter().any(|days| {
        let d = Date::from_days(days);
        let start = Time(d.days() * SECONDS_PER_DAY + w.start_time - w.utc_offset);
        w.is_schedule_date(d) && start <= t && t < start.plus(w.duration)
    });
    let blocked = w.spec().not_allowed_dates.iter().any(|span| {
        let (from, to) = (
            Date::parse(&span.start).unwrap(),
            Date::parse(&span.end).unwrap(),
        );
        from <= today && today <= to
    });
    in_instance && !blocked
}

fn agrees(w: &MaintenanceWindow, t: Time) {
    assert_eq!(
        w.is_open(t),
        oracle(w, t),
        "is_open({t}) disagrees with the schedule dates"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some(value) = request_json(data) else {
        return;
    };
    let spec: MaintenanceWindowSpec = match from_json_value(value, ROOT) {
        Ok(s) => s,
        Err(e) => return check_error(&e, ROOT),
    };
    let w = match MaintenanceWindow::parse(&spec, ROOT) {
        Ok(w) => w,
        Err(e) => return check_error(&e, ROOT),
    };
    assert_eq!(w.spec(), &spec);
    let text = serde_json::to_string(w.spec()).expect("a window serializes");
    let again: MaintenanceWindowSpec =
        from_json_value(serde_json::from_str(&text).unwrap(), ROOT).expect("reads back");
    assert_eq!(again, spec, "changed in its round trip through {text}");
    assert_eq!(MaintenanceWindow::parse(&again, ROOT).as_ref(), Ok(&w));
    assert!((4 * 3600..=24 * 3600).contains(&w.duration));

    let mut instants: Vec<Time> = [
        "2026-03-02T00:00:00Z",
        "2026-03-07T13:37:11Z",
        "1970-01-01T00:00:00Z",
        "2024-02-29T23:59:59Z",
        "2099-12-31T12:00:00Z",
    ]
    .iter()
    .map(|t| Time::parse(t).unwrap())
    .collect();
    // Around the dates the window names.
    let named = spec
        .start_date
        .iter()
        .chain(spec.not_allowed_dates.iter().map(|s| &s.start));
    for d in named.filter_map(|d| Date::parse(d)).take(2) {
        instants.push(Time(d.days() * SECONDS_PER_DAY - SECONDS_PER_DAY + 1));
    }
    for (i, &t0) in instants.iter().enumerate() {
        let mut t = t0;
        // Consecutive openings from t0.
        for _ in 0..4 {
            agrees(&w, t);
            let Some(o) = w.next_opening(t) else {
                assert!(!w.is_open(t));
                break;
            };
            assert!(o.from >= t, "{o:?} before {t}");
            assert!(o.from < o.until, "an empty opening {o:?}");
            assert!(
                o.until.unix() - o.from.unix() <= w.duration,
                "{o:?} longer than an instance"
            );
            // The same opening from any instant inside it.
            let mid = Time((o.from.unix() + o.until.unix()) / 2);
            for at in [o.from, mid, Time(o.until.unix() - 1)] {
                assert_eq!(
                    w.next_opening(at),
                    Some(Opening {
                        from: at,
                        until: o.until
                    }),
                    "from {at} inside {o:?}"
                );
                agrees(&w, at);
            }
            // Closed between the instant asked about and the opening: boundaries are whole
            // minutes, so a minute walk (from the first instant, for up to two days) is exact.
            if i == 0 {
                let mut at = t;
                while at < o.from && at.unix() - t.unix() < 2 * SECONDS_PER_DAY {
                    assert!(
                        !oracle(&w, at),
                        "open at {at}, before the opening {o:?} found from {t}"
                    );
                    at = at.plus(60);
                }
            } else if o.from > t {
                agrees(&w, Time(o.from.unix() - 1));
                agrees(&w, Time((t.unix() + o.from.unix()) / 2));
            }
            agrees(&w, o.until);
            t = o.until;
        }
    }
});
