//! The repair under real concurrency and real crashes, with real processes:
//! many `linkerd-cni chain repair` runs against a primary CNI that keeps
//! rewriting its file, and repairs killed with SIGKILL at random points.

use std::fs::{self, File};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::TempDir;
use testkit::chain::{desired, fixtures, is_linkerd, plugins};

const BIN: &str = env!("CARGO_BIN_EXE_linkerd-cni");

fn repair_cmd(conf_dir: &Path, entry: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args(["chain", "repair", "--conf-dir"])
        .arg(conf_dir)
        .arg("--entry")
        .arg(entry)
        .env_clear()
        .stdin(Stdio::null());
    c
}

/// A tiny xorshift: no rand crate for a few hundred delays. The seed is
/// printed so that a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("CHAIN_STRESS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("CHAIN_STRESS_SEED={seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// The primary CNI's installer, as a separate process: rewrites its conflist
/// (without our entry) with a new generation number, GENERATIONS times,
/// alternately by rename and by truncate-and-write. After each write it
/// looks again: the file must carry that generation (repaired or not); an
/// older one means a repair undid its write. A truncate-and-write that
/// lands in the file a repair is exchanging away is seen undone until that
/// repair puts it back (it compares what it exchanged away with what it
/// read, right after the exchange); a repair preempted between the two,
/// on a loaded machine, stretches that for tens of milliseconds. So an
/// older generation counts as lost only when it is still there once no
/// repair could still be putting it back: after the lock's 2 s bound.
/// Prints the last generation, the lost updates and the late ones.
const PRIMARY: &str = r#"
f="$1/10-calico.conflist"
n=0; lost=0; late=0
while [ "$n" -lt "$2" ]; do
  n=$((n+1))
  body='{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "calico", "x-generation": '"$n"', "ipam": {"type": "calico-ipam"}},
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
  ]
}'
  if [ $((n % 2)) -eq 0 ]; then
    printf '%s\n' "$body" > "$1/.calico.tmp" && mv "$1/.calico.tmp" "$f"
  else
    printf '%s\n' "$body" > "$f"
  fi
  sleep 0.003
  g=$(grep -o '"x-generation": [0-9]*' "$f" | grep -o '[0-9]*$')
  if [ "$g" != "$n" ]; then
    late=$((late+1)); echo "generation $n was replaced by $g" >&2
    end=$(($(date +%s%N) + 2500000000))
    while [ "$g" != "$n" ] && [ "$(date +%s%N)" -lt "$end" ]; do
      sleep 0.01
      g=$(grep -o '"x-generation": [0-9]*' "$f" | grep -o '[0-9]*$')
    done
    if [ "$g" != "$n" ]; then
      lost=$((lost+1)); echo "generation $n lost: $g after 2.5 s" >&2
    fi
  fi
done
echo "$n $lost $late"
"#;

/// How many times the primary rewrites its file (a few seconds under the
/// load of 50 repair loops on two cores).
const GENERATIONS: u64 = 80;

#[test]
fn fifty_repairs_against_a_rewriting_primary_lose_no_update() {
    let d = TempDir::new("conc").unwrap();
    let e = TempDir::new("conc-entry").unwrap();
    let entry = e.write("entry.json", &Value::Object(desired()).to_string());
    fs::copy(
        fixtures().join("calico/in/10-calico.conflist"),
        d.join("10-calico.conflist"),
    )
    .unwrap();

    let primary = Command::new("sh")
        .args(["-c", PRIMARY, "primary"])
        .arg(d.path())
        .arg(GENERATIONS.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let stop = Arc::new(AtomicBool::new(false));
    let repaired = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..50)
        .map(|_| {
            let (stop, repaired, runs) = (stop.clone(), repaired.clone(), runs.clone());
            let (dir, entry) = (d.path().to_path_buf(), entry.clone());
            thread::spawn(move || -> Result<(), String> {
                while !stop.load(Ordering::Relaxed) {
                    let o = repair_cmd(&dir, &entry)
                        .output()
                        .map_err(|e| e.to_string())?;
                    runs.fetch_add(1, Ordering::Relaxed);
                    let out = String::from_utf8_lossy(&o.stdout);
                    let err = String::from_utf8_lossy(&o.stderr);
                    match o.status.code() {
                        Some(0) if out.starts_with("repaired") => {
                            repaired.fetch_add(1, Ordering::Relaxed);
                        }
                        // 0: healthy already; 1: caught the primary
                        // mid-write (not valid JSON), nothing written.
                        Some(0 | 1) => {}
                        // Waiting behind 49 others may exceed the 2 s bound.
                        Some(2) if err.contains("waiting for the lock") => {}
                        _ => return Err(format!("{:?}\n{out}\n{err}", o.status)),
                    }
                }
                Ok(())
            })
        })
        .collect();
    let out = primary.wait_with_output().unwrap();
    assert!(out.status.success());
    let report = String::from_utf8_lossy(&out.stdout);
    let counts: Vec<u64> = report
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let [last, lost, late] = counts[..] else {
        panic!("the primary's report: {report:?}");
    };
    // The repair loops go on until one has run after the primary's last
    // write: wait for that (our entry back, last, on the last generation),
    // with a generous deadline; the assertions below judge what we got.
    let file = d.join("10-calico.conflist");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let list = plugins(&fs::read_to_string(&file).unwrap());
        if list.last().is_some_and(is_linkerd) && list[0]["x-generation"] == last {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap().unwrap();
    }
    eprintln!(
        "primary wrote {last} generations ({lost} undone, {late} seen undone until a repair put them back); {} repair runs, {} repaired",
        runs.load(Ordering::Relaxed),
        repaired.load(Ordering::Relaxed)
    );

    let text = fs::read_to_string(d.join("10-calico.conflist")).unwrap();
    let list = plugins(&text);
    let ours: Vec<usize> = (0..list.len()).filter(|&i| is_linkerd(&list[i])).collect();
    assert_eq!(ours, [list.len() - 1], "{text}");
    assert_eq!(list.len(), 3, "{text}");
    // No lost update: none of the primary's writes was undone, and its last
    // one is what was repaired.
    assert_eq!(lost, 0, "repairs undid {lost} of the primary's writes");
    assert_eq!(list[0]["x-generation"], Value::from(last), "{text}");
    assert_eq!(d.names(), ["10-calico.conflist"], "temp files left behind");
    assert_eq!(last, GENERATIONS);
    assert!(repaired.load(Ordering::Relaxed) >= 5);
}

/// What a conf dir holds, by name.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, fs::read(e.path()).unwrap_or_default())
        })
        .collect();
    v.sort();
    v
}

fn active(snap: &[(String, Vec<u8>)]) -> Option<&(String, Vec<u8>)> {
    snap.iter()
        .find(|(n, _)| n.ends_with(".conf") || n.ends_with(".conflist") || n.ends_with(".json"))
}

#[test]
fn kill_9_at_random_points_leaves_old_or_new_and_no_held_lock() {
    let d = TempDir::new("crash").unwrap();
    let e = TempDir::new("crash-entry").unwrap();
    let entry = e.write("entry.json", &Value::Object(desired()).to_string());
    let calico = fs::read(fixtures().join("calico/in/10-calico.conflist")).unwrap();
    let bridge = br#"{"cniVersion":"0.4.0","name":"br","type":"bridge","bridge":"cni0"}"#.to_vec();
    let cases: [(&str, &[u8], &str); 2] = [
        ("10-calico.conflist", &calico, "10-calico.conflist"),
        ("10-bridge.conf", &bridge, "10-bridge.conflist"),
    ];
    let reset = |name: &str, content: &[u8]| {
        for (n, _) in snapshot(d.path()) {
            fs::remove_file(d.join(&n)).unwrap();
        }
        fs::write(d.join(name), content).unwrap();
    };
    // The repaired content, and how long an uninterrupted repair takes.
    let mut new = Vec::new();
    let mut took = Vec::new();
    for (name, old, out) in cases {
        for _ in 0..3 {
            reset(name, old);
            let start = Instant::now();
            let o = repair_cmd(d.path(), &entry).output().unwrap();
            took.push(start.elapsed());
            assert!(o.status.success(), "{o:?}");
            assert_eq!(d.names(), [out]);
        }
        new.push(fs::read(d.join(out)).unwrap());
    }
    took.sort();
    // Kills spread over the whole run and a little past it.
    let span = took[took.len() / 2].as_micros() as u64 * 3 / 2;

    let mut rng = Rng::new();
    let (mut saw_old, mut saw_new, mut saw_temp) = (0, 0, 0);
    for trial in 0..240 {
        let c = trial % 2;
        let (name, old, out) = cases[c];
        reset(name, old);
        let mut child = repair_cmd(d.path(), &entry)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        thread::sleep(Duration::from_micros(rng.below(span)));
        let _ = child.kill();
        child.wait().unwrap();

        let snap = snapshot(d.path());
        let ctx = format!(
            "trial {trial}: {:?}",
            snap.iter().map(|s| &s.0).collect::<Vec<_>>()
        );
        let (an, ac) = active(&snap).unwrap_or_else(|| panic!("{ctx}: no active config"));
        serde_json::from_slice::<Value>(ac)
            .unwrap_or_else(|e| panic!("{ctx}: active does not parse: {e}"));
        if an == name && ac == old {
            saw_old += 1;
        } else if an == out && *ac == new[c] {
            saw_new += 1;
        } else {
            panic!("{ctx}: active {an} is neither the old nor the new content");
        }
        if snap
            .iter()
            .any(|(n, _)| n.starts_with(linkerd_cni_chain::TEMP_PREFIX))
        {
            saw_temp += 1;
        }
        // The kernel dropped the dead repair's locks: the lock file's and
        // the conf dir's own.
        let dir = File::open(d.path()).unwrap();
        dir.try_lock()
            .unwrap_or_else(|e| panic!("{ctx}: the conf dir is still locked: {e:?}"));
        drop(dir);
        let lock = linkerd_cni_chain::lock_dir(d.path(), Duration::from_millis(100), None)
            .unwrap_or_else(|e| panic!("{ctx}: lock still held: {e}"));
        drop(lock);
        // The next repair succeeds and cleans up.
        let o = repair_cmd(d.path(), &entry).output().unwrap();
        assert!(o.status.success(), "{ctx}: {o:?}");
        assert_eq!(d.names(), [out], "{ctx}");
        assert_eq!(fs::read(d.join(out)).unwrap(), new[c], "{ctx}");
    }
    eprintln!(
        "240 kills: {saw_old} left the old content, {saw_new} the new, {saw_temp} a temp file"
    );
    // The kills landed before and after the switch, not all on one side.
    assert!(saw_old > 0 && saw_new > 0);
}
