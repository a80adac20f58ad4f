//! Tests of `code.interpret` beyond `test_code_run`: state kept between cells, the error
//! shape, a cancelled cell keeps its context's state, a rich result. Python cells (the
//! language every provider of `code.interpret` runs).

use super::client::short;
use super::{ensure, pass, Done, Outcome, Sb, T};
use serde_json::{json, Value};
use std::time::Duration;

/// A sandbox for Python cells, or the test's skip when the sandbox's template has no Python
/// (an image without `python3`: the interpreter cannot start, E3003), which says nothing
/// about the provider.
pub(crate) async fn python_sandbox(t: &T) -> Result<Sb, Outcome> {
    let sb = t.create(json!({})).await.map_err(Err)?;
    match t
        .client()
        .call(
            "code/run",
            json!({"sandbox": sb.id, "language": "python", "code": "pass"}),
        )
        .await
    {
        Err(e) if e.is(&["E3003"]) => Err(Ok(Done::Skipped(format!(
            "the sandbox's template has no Python interpreter ({})",
            short(&e.to_string())
        )))),
        // Anything else is the test's to judge.
        _ => Ok(sb),
    }
}

fn plain(r: &Value) -> String {
    r["results"][0]["text/plain"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

pub async fn state_kept(t: &T) -> Outcome {
    let c = t.client();
    let sb = match python_sandbox(t).await {
        Ok(sb) => sb,
        Err(skip) => return skip,
    };
    let run = |code: &'static str| {
        c.ok(
            "code/run",
            json!({"sandbox": sb.id, "language": "python", "code": code}),
        )
    };
    let a = run("kit_x = 41\nimport os").await?;
    ensure!(
        a["error"].is_null(),
        "code/run of an assignment answered error {}",
        a["error"]
    );
    let b = run("kit_x + 1").await?;
    ensure!(
        plain(&b) == "42",
        "the second cell's last expression kit_x + 1 gave results {} (the first cell set kit_x = 41)",
        short(&b["results"].to_string())
    );
    let (n1, n2) = (
        a["executionCount"].as_u64().unwrap_or(0),
        b["executionCount"].as_u64().unwrap_or(0),
    );
    ensure!(
        n2 > n1,
        "executionCount did not grow between cells ({n1} then {n2})"
    );
    pass()
}

pub async fn error_shape(t: &T) -> Outcome {
    let c = t.client();
    let sb = match python_sandbox(t).await {
        Ok(sb) => sb,
        Err(skip) => return skip,
    };
    let r = c
        .ok(
            "code/run",
            json!({"sandbox": sb.id, "language": "python",
                   "code": "print('kit-before')\nraise ValueError('kit-bad')"}),
        )
        .await?;
    let e = &r["error"];
    ensure!(
        e["name"] == "ValueError" && e["value"] == "kit-bad",
        "a raised ValueError('kit-bad') answered error {}",
        short(&e.to_string())
    );
    ensure!(
        e["traceback"]
            .as_str()
            .is_some_and(|tb| tb.contains("kit-bad")),
        "the error's traceback does not show the error: {}",
        short(&e["traceback"].to_string())
    );
    ensure!(
        r["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("kit-before"),
        "the output before the error is lost: stdout {}",
        r["stdout"]
    );
    pass()
}

pub async fn cancel_keeps_state(t: &T) -> Outcome {
    let c = t.client();
    let sb = match python_sandbox(t).await {
        Ok(sb) => sb,
        Err(skip) => return skip,
    };
    c.ok(
        "code/run",
        json!({"sandbox": sb.id, "language": "python", "code": "kit_kept = 5"}),
    )
    .await?;
    let mut notes = c.stream("kit-slow");
    let (id, rx) = c
        .send(
            "code/run",
            json!({"sandbox": sb.id, "language": "python", "runId": "kit-slow",
                   "code": "import time\nprint('kit-go', flush=True)\ntime.sleep(25)\nkit_kept = 6"}),
        )
        .await;
    // Cancel once the cell surely runs: its first output arrived.
    let started = async {
        while let Some(n) = notes.next(Duration::from_secs(10)).await {
            if n.method == "code/output"
                && n.params["text"]
                    .as_str()
                    .is_some_and(|s| s.contains("kit-go"))
            {
                return true;
            }
        }
        false
    };
    ensure!(
        started.await,
        "no code/output with runId kit-slow carried the cell's first print"
    );
    c.cancel(id).await;
    let v = match tokio::time::timeout(Duration::from_secs(10), rx).await {
        Ok(Ok((_, v))) => v,
        _ => return Err("the cancelled code/run was not answered within 10 s".into()),
    };
    ensure!(
        v["error"]["code"] == -32800,
        "the cancelled code/run answered {}, expected error -32800",
        short(&v.to_string())
    );
    let r = c
        .ok(
            "code/run",
            json!({"sandbox": sb.id, "language": "python", "code": "kit_kept"}),
        )
        .await?;
    ensure!(
        plain(&r) == "5",
        "after a cancelled cell, kit_kept gave results {} error {} (expected 5: state kept, the cell interrupted)",
        short(&r["results"].to_string()),
        short(&r["error"].to_string())
    );
    pass()
}

pub async fn rich_result(t: &T) -> Outcome {
    let c = t.client();
    let sb = match python_sandbox(t).await {
        Ok(sb) => sb,
        Err(skip) => return skip,
    };
    let code = "class KitRich:\n    def _repr_html_(self):\n        return '<b>kit</b>'\n    def __repr__(self):\n        return 'KitRich()'\nKitRich()";
    let r = c
        .ok(
            "code/run",
            json!({"sandbox": sb.id, "language": "python", "code": code}),
        )
        .await?;
    let b = &r["results"][0];
    ensure!(
        b["text/html"] == "<b>kit</b>" && b["text/plain"] == "KitRich()",
        "an object with _repr_html_ as the last expression gave results {} (expected text/html and text/plain)",
        short(&r["results"].to_string())
    );
    pass()
}
