//! tonic's route_guide (`proto/route_guide.proto`): a server with one RPC of each shape, and a
//! client workload that calls all four, through a blocking `Client` or a shareable `Channel`,
//! and checks every answer against what it computes itself from the same feature database.
//!
//! The database is generated (tonic ships a JSON file of 100 named places around New Jersey):
//! [`features`] places [`FEATURES`] points on a grid in that area, every third one unnamed (a
//! point with no feature, as tonic's file has).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rpc_core::codegen::{Channel, Client, RequestContext, RequestStream, Responder, Status, StreamSink};

use crate::routeguide::route_guide_client::RouteGuideClient;
use crate::routeguide::route_guide_server::RouteGuide;
use crate::routeguide::{Feature, Point, Rectangle, RouteNote, RouteSummary};

/// Points in the generated database.
pub const FEATURES: usize = 100;

/// The database: [`FEATURES`] points on a 10 × 10 grid from 40.0° N 74.0° W (E7 units, 0.1°
/// apart); every third one has no name.
pub fn features() -> Vec<Feature> {
    (0..FEATURES as i32)
        .map(|i| Feature {
            name: if i % 3 == 2 {
                String::new()
            } else {
                format!("Feature {i} of the generated route guide")
            },
            location: Some(Point {
                latitude: 400_000_000 + (i / 10) * 1_000_000,
                longitude: -740_000_000 + (i % 10) * 1_000_000,
            }),
        })
        .collect()
}

/// Whether `p` is inside `r` (corners in any order, edges included), as tonic's example.
pub fn in_range(p: &Point, r: &Rectangle) -> bool {
    let (lo, hi) = (r.lo.unwrap_or_default(), r.hi.unwrap_or_default());
    let (left, right) = (lo.longitude.min(hi.longitude), lo.longitude.max(hi.longitude));
    let (bottom, top) = (lo.latitude.min(hi.latitude), lo.latitude.max(hi.latitude));
    (left..=right).contains(&p.longitude) && (bottom..=top).contains(&p.latitude)
}

/// Distance between two points in metres (haversine), as tonic's example computes it.
pub fn distance(a: &Point, b: &Point) -> i32 {
    const COORD_FACTOR: f64 = 1e7;
    const R: f64 = 6_371_000.0;
    let lat1 = (a.latitude as f64 / COORD_FACTOR).to_radians();
    let lat2 = (b.latitude as f64 / COORD_FACTOR).to_radians();
    let dlat = lat2 - lat1;
    let dlon = ((b.longitude - a.longitude) as f64 / COORD_FACTOR).to_radians();
    let h = (dlat / 2.0).sin().powi(2) + lat1.cos() * lat2.cos() * (dlon / 2.0).sin().powi(2);
    (R * 2.0 * h.sqrt().atan2((1.0 - h).sqrt())) as i32
}

/// RouteChat's notes by location (latitude, longitude).
type Notes = Arc<Mutex<HashMap<(i32, i32), Vec<RouteNote>>>>;

/// The server: the database, and the notes of RouteChat by location.
#[derive(Default)]
pub struct RouteGuideService {
    features: Arc<Vec<Feature>>,
    notes: Notes,
}

impl RouteGuideService {
    /// A server over the generated [`features`].
    pub fn new() -> RouteGuideService {
        RouteGuideService { features: Arc::new(features()), notes: Arc::default() }
    }
}

fn key(p: &Option<Point>) -> (i32, i32) {
    let p = p.unwrap_or_default();
    (p.latitude, p.longitude)
}

impl RouteGuide for RouteGuideService {
    fn get_feature(&self, _ctx: &RequestContext, request: Point) -> rpc_core::codegen::Reply<Feature> {
        let found = self.features.iter().find(|f| f.location.as_ref() == Some(&request)).cloned();
        found.unwrap_or(Feature { name: String::new(), location: Some(request) }).into()
    }

    fn list_features(&self, _ctx: &RequestContext, request: Rectangle, sink: StreamSink<Feature>) {
        let features = self.features.clone();
        std::thread::spawn(move || {
            for f in features.iter().filter(|f| f.location.as_ref().is_some_and(|p| in_range(p, &request))) {
                if sink.send(f).is_err() {
                    return;
                }
            }
        });
    }

    fn record_route(
        &self,
        _ctx: &RequestContext,
        requests: RequestStream<Point>,
        responder: Responder<RouteSummary>,
    ) {
        let features = self.features.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut summary = RouteSummary::default();
            let mut last: Option<Point> = None;
            for point in requests {
                let point = match point {
                    Ok(p) => p,
                    // Cancelled: nobody wants the summary.
                    Err(s) => return responder.send(Err(s)),
                };
                summary.point_count += 1;
                if features.iter().any(|f| f.location.as_ref() == Some(&point) && !f.name.is_empty()) {
                    summary.feature_count += 1;
                }
                if let Some(l) = &last {
                    summary.distance += distance(l, &point);
                }
                last = Some(point);
            }
            summary.elapsed_time = start.elapsed().as_secs() as i32;
            responder.send(Ok(summary));
        });
    }

    fn route_chat(
        &self,
        _ctx: &RequestContext,
        requests: RequestStream<RouteNote>,
        sink: StreamSink<RouteNote>,
    ) {
        let notes = self.notes.clone();
        std::thread::spawn(move || {
            for note in requests {
                let Ok(note) = note else { return };
                // Every note sent at this location before, then this one is kept.
                let earlier = {
                    let mut all = notes.lock().unwrap_or_else(|e| e.into_inner());
                    let here = all.entry(key(&note.location)).or_default();
                    let earlier = here.clone();
                    here.push(note);
                    earlier
                };
                for n in &earlier {
                    if sink.send(n).is_err() {
                        return;
                    }
                }
            }
        });
    }
}

/// A wrong answer: what was asked, what came, what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Wrong {
    /// The call failed.
    #[error("{0}: {1}")]
    Call(&'static str, Status),
    /// The answer differs from the expected one.
    #[error("{what}: got {got}, expected {expected}")]
    Answer {
        /// The RPC and what was checked.
        what: String,
        /// What came.
        got: String,
        /// What the client computed.
        expected: String,
    },
}

fn check<T: PartialEq + std::fmt::Debug>(what: impl Into<String>, got: T, expected: T) -> Result<(), Wrong> {
    if got == expected {
        return Ok(());
    }
    Err(Wrong::Answer { what: what.into(), got: format!("{got:?}"), expected: format!("{expected:?}") })
}

/// The rectangle ListFeatures is asked for: rows 2..=5, columns 3..=8 of the grid (24 points).
pub fn rectangle() -> Rectangle {
    Rectangle {
        lo: Some(Point { latitude: 402_000_000, longitude: -737_000_000 }),
        hi: Some(Point { latitude: 405_000_000, longitude: -732_000_000 }),
    }
}

/// The route RecordRoute is sent: `n` points of the database (every seventh, wrapping), then two
/// points that are no feature.
pub fn route(n: usize) -> Vec<Point> {
    let db = features();
    let mut r: Vec<Point> = (0..n).map(|i| db[(i * 7) % FEATURES].location.unwrap_or_default()).collect();
    r.push(Point { latitude: 1, longitude: 2 });
    r.push(Point { latitude: 3, longitude: 4 });
    r
}

/// The notes RouteChat is sent: 12 notes at 4 locations, in turn (each note's answer is the
/// notes sent at its location before, by this run: a location of its own per `run`).
pub fn chat_notes(run: i32) -> Vec<RouteNote> {
    (0..12)
        .map(|i| RouteNote {
            location: Some(Point { latitude: run, longitude: i % 4 }),
            message: format!("note {i} of run {run}"),
        })
        .collect()
}

/// What the server answers to note `i` of `notes`: the earlier ones at the same location.
pub fn chat_expected(notes: &[RouteNote], i: usize) -> Vec<RouteNote> {
    notes[..i].iter().filter(|n| n.location == notes[i].location).cloned().collect()
}

/// What RecordRoute answers for `route` (all but the elapsed time).
pub fn summary_expected(route: &[Point]) -> RouteSummary {
    let db = features();
    RouteSummary {
        point_count: route.len() as i32,
        feature_count: route
            .iter()
            .filter(|p| db.iter().any(|f| f.location.as_ref() == Some(p) && !f.name.is_empty()))
            .count() as i32,
        distance: route.windows(2).map(|w| distance(&w[0], &w[1])).sum(),
        elapsed_time: 0,
    }
}

/// Calls all four RPCs through a blocking stub and checks every answer; `run` keeps this run's
/// chat notes apart from other runs' on the same server. Prints one line per RPC to `out`.
///
/// # Errors
/// The first failed call or wrong answer.
pub fn run_blocking(
    client: &RouteGuideClient<Client>,
    run: i32,
    out: &mut impl std::io::Write,
) -> Result<(), Wrong> {
    let db = features();
    // GetFeature: a named place, an unnamed one, a point off the grid.
    for p in [
        db[0].location.unwrap_or_default(),
        db[2].location.unwrap_or_default(),
        Point { latitude: 5, longitude: 6 },
    ] {
        let f = client.get_feature(p).map_err(|s| Wrong::Call("GetFeature", s))?;
        let expected = db
            .iter()
            .find(|f| f.location == Some(p))
            .cloned()
            .unwrap_or(Feature { name: String::new(), location: Some(p) });
        check(format!("GetFeature({p:?})"), f, expected)?;
    }
    let _ = writeln!(out, "GetFeature: 3 points, checked");
    // ListFeatures.
    let rect = rectangle();
    let got: Result<Vec<Feature>, Status> =
        client.list_features(rect).map_err(|s| Wrong::Call("ListFeatures", s))?.collect();
    let got = got.map_err(|s| Wrong::Call("ListFeatures", s))?;
    let expected: Vec<Feature> =
        db.iter().filter(|f| in_range(&f.location.unwrap_or_default(), &rect)).cloned().collect();
    let n = got.len();
    check("ListFeatures", got, expected)?;
    let _ = writeln!(out, "ListFeatures: {n} features in the rectangle, checked");
    // RecordRoute.
    let points = route(40);
    let mut rec = client.record_route().map_err(|s| Wrong::Call("RecordRoute", s))?;
    for p in &points {
        rec.send(p).map_err(|s| Wrong::Call("RecordRoute", s))?;
    }
    let summary = rec.finish().map_err(|s| Wrong::Call("RecordRoute", s))?;
    check("RecordRoute", RouteSummary { elapsed_time: 0, ..summary }, summary_expected(&points))?;
    let _ = writeln!(
        out,
        "RecordRoute: {} points, {} features, {} m, checked",
        summary.point_count, summary.feature_count, summary.distance
    );
    // RouteChat: after each note, exactly the earlier notes at its location come back.
    let notes = chat_notes(run);
    let mut chat = client.route_chat().map_err(|s| Wrong::Call("RouteChat", s))?;
    let mut answers = 0;
    for (i, note) in notes.iter().enumerate() {
        chat.send(note).map_err(|s| Wrong::Call("RouteChat", s))?;
        for want in chat_expected(&notes, i) {
            let got = chat.message().map_err(|s| Wrong::Call("RouteChat", s))?;
            check(format!("RouteChat answer to note {i}"), got, Some(want))?;
            answers += 1;
        }
    }
    chat.finish();
    check("RouteChat end", chat.message().map_err(|s| Wrong::Call("RouteChat", s))?, None)?;
    let _ = writeln!(out, "RouteChat: {} notes, {answers} notes back, checked", notes.len());
    Ok(())
}

/// [`run_blocking`] through a `Channel` stub from a task (the chat's two directions in two tasks).
///
/// # Errors
/// The first failed call or wrong answer.
pub async fn run_channel(client: &RouteGuideClient<Channel>, run: i32) -> Result<(), Wrong> {
    let db = features();
    let p = db[0].location.unwrap_or_default();
    let f = client.get_feature(p).await.map_err(|s| Wrong::Call("GetFeature", s))?;
    check("GetFeature", f, db[0].clone())?;
    let rect = rectangle();
    let mut rx = client.list_features(rect);
    let mut got = Vec::new();
    while let Some(f) = rx.message().await.map_err(|s| Wrong::Call("ListFeatures", s))? {
        got.push(f);
    }
    let expected: Vec<Feature> =
        db.iter().filter(|f| in_range(&f.location.unwrap_or_default(), &rect)).cloned().collect();
    check("ListFeatures", got, expected)?;
    let points = route(25);
    let mut rec = client.record_route();
    for p in &points {
        rec.send(p).await.map_err(|s| Wrong::Call("RecordRoute", s))?;
    }
    let summary = rec.finish().await.map_err(|s| Wrong::Call("RecordRoute", s))?;
    check("RecordRoute", RouteSummary { elapsed_time: 0, ..summary }, summary_expected(&points))?;
    let notes = chat_notes(run);
    let (mut tx, mut rx) = client.route_chat();
    let sent = notes.clone();
    let sender = tokio::spawn(async move {
        for n in &sent {
            tx.send(n).await?;
        }
        tx.finish();
        Ok::<(), Status>(())
    });
    let mut got = Vec::new();
    while let Some(n) = rx.message().await.map_err(|s| Wrong::Call("RouteChat", s))? {
        got.push(n);
    }
    sender
        .await
        .map_err(|e| Wrong::Call("RouteChat", Status::internal(e.to_string())))?
        .map_err(|s| Wrong::Call("RouteChat", s))?;
    let expected: Vec<RouteNote> = (0..notes.len()).flat_map(|i| chat_expected(&notes, i)).collect();
    check("RouteChat (channel)", got, expected)?;
    Ok(())
}
