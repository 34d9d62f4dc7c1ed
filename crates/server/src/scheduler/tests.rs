//! The scheduler's commands on its state alone (no model, no lane
//! threads: each lane's inbox is read here): admission against the token
//! budget, first-come-first-served dispatch, cancellation freeing a queued
//! request's share or a running one's lane at once, status, shutdown.

use std::sync::mpsc::{Receiver, channel};
use std::time::Instant;

use ds4_sampling::{Law, Sampler};

use super::*;
use crate::events::WorkEvent;

struct Harness {
    scheduler: Scheduler<'static>,
    inboxes: Vec<Receiver<Box<Job>>>,
    /// The jobs' event receivers (a job whose receiver is dropped has lost
    /// its client).
    clients: BTreeMap<u64, mpsc::UnboundedReceiver<WorkEvent>>,
}

fn harness(lanes: usize, max_tokens: usize) -> Harness {
    let metrics: &'static Metrics = Box::leak(Box::default());
    let stopping: &'static AtomicBool = Box::leak(Box::default());
    let (senders, inboxes): (Vec<_>, Vec<_>) = (0..lanes).map(|_| channel()).unzip();
    Harness {
        scheduler: Scheduler {
            queue: WaitQueue::new(QueueLimits {
                max_tokens,
                max_count: None,
            }),
            lanes: (0..lanes).map(|_| LaneState::default()).collect(),
            running: BTreeMap::new(),
            inboxes: senders,
            metrics,
            stopping,
            closing: None,
        },
        inboxes,
        clients: BTreeMap::new(),
    }
}

impl Harness {
    /// Submit job `id` of `prompt_len` + `max_tokens` tokens, as the
    /// scheduler thread handles a `Submit` command.
    fn submit(&mut self, id: u64, prompt_len: usize, max_tokens: usize) -> Result<(), Rejected> {
        let (events, client) = mpsc::unbounded_channel();
        self.clients.insert(id, client);
        let job = Job {
            id,
            cancel: CancelToken::new(),
            admitted: Instant::now(),
            continuation: false,
            prompt: vec![id as u32; prompt_len],
            sampler: Sampler::new(Law::Nucleus, Law::Nucleus.default_params(), 1).unwrap(),
            max_tokens,
            stops: Vec::new(),
            logprobs: None,
            prompt_logprobs: None,
            mtp_depth: None,
            structural: false,
            constraint: None,
            vision: None,
            events,
        };
        let (reply, mut answer) = oneshot::channel();
        self.command(Command::Submit {
            job: Box::new(job),
            reply,
        });
        answer.try_recv().expect("Submit is answered at once")
    }

    fn command(&mut self, command: Command) {
        self.scheduler.handle(command);
        self.scheduler.dispatch();
        self.scheduler.publish();
    }

    /// The job lane `lane` was given since the last look, if any.
    fn started(&self, lane: usize) -> Option<Box<Job>> {
        self.inboxes[lane].try_recv().ok()
    }

    fn status(&mut self) -> SchedulerStatus {
        let (reply, mut answer) = oneshot::channel();
        self.command(Command::Status { reply });
        answer.try_recv().unwrap()
    }
}

#[test]
fn one_lane_runs_the_oldest_and_the_budget_bounds_the_rest() {
    let mut h = harness(1, 100);
    h.submit(1, 10, 500).unwrap();
    // Running jobs are not in the budget: job 1 went to the lane.
    assert_eq!(h.started(0).unwrap().id, 1);
    h.submit(2, 10, 40).unwrap();
    h.submit(3, 10, 40).unwrap();
    let Err(Rejected::QueueFull(full)) = h.submit(4, 1, 0) else {
        panic!("100 tokens are reserved")
    };
    assert_eq!((full.waiting, full.reserved_tokens), (2, 100));
    let s = h.status();
    assert_eq!((s.waiting, s.reserved_tokens, s.running), (2, 100, 1));
    assert!(
        h.scheduler
            .metrics
            .render()
            .contains("ds4_queue_reserved_tokens 100")
    );
    // The lane ends job 1's turn: the oldest waiting one runs next.
    h.command(Command::LaneIdle {
        lane: 0,
        tokens: vec![1; 12],
    });
    assert_eq!(h.started(0).unwrap().id, 2);
    assert_eq!(h.status().reserved_tokens, 50);
}

#[test]
fn cancelling_frees_a_queued_share_and_a_running_lane_at_once() {
    let mut h = harness(1, 100);
    h.submit(1, 10, 10).unwrap();
    let running = h.started(0).unwrap();
    h.submit(2, 50, 50).unwrap();
    assert!(h.submit(3, 50, 50).is_err());
    // The waiting client leaves: its 100 tokens are free for the next.
    h.command(Command::Cancel { id: 2 });
    assert_eq!(h.status().waiting, 0);
    h.submit(3, 50, 50).unwrap();
    // A client that left without a word (its receiver dropped) frees its
    // share before the next request is weighed.
    drop(h.clients.remove(&3));
    h.submit(4, 50, 50).unwrap();
    assert_eq!(h.status().reserved_tokens, 100);
    // The running client leaves: its turn's token is set at once, and the
    // lane takes the next job as soon as the turn ends.
    assert!(!running.cancel.is_cancelled());
    h.command(Command::Cancel { id: 1 });
    assert!(running.cancel.is_cancelled());
    h.command(Command::LaneIdle {
        lane: 0,
        tokens: Vec::new(),
    });
    assert_eq!(h.started(0).unwrap().id, 4);
    // Two cancelled while waiting (the one dropped silently included).
    let snap = h.scheduler.metrics.snapshot();
    assert_eq!(snap.cancelled, 2);
}

#[test]
fn a_conversation_returns_to_its_lane_and_order_holds_across_lanes() {
    let mut h = harness(2, 1000);
    h.submit(1, 4, 4).unwrap();
    h.submit(2, 4, 4).unwrap();
    assert_eq!(h.started(0).unwrap().id, 1);
    assert_eq!(h.started(1).unwrap().id, 2);
    h.submit(3, 4, 4).unwrap();
    h.submit(4, 4, 4).unwrap();
    // Lane 1 ends with a session of job 2's tokens; the oldest waiting job
    // (3) goes there, the only free lane.
    h.command(Command::LaneIdle {
        lane: 1,
        tokens: vec![2; 6],
    });
    assert_eq!(h.started(1).unwrap().id, 3);
    h.command(Command::LaneIdle {
        lane: 0,
        tokens: vec![1; 6],
    });
    assert_eq!(h.started(0).unwrap().id, 4);
    // Both free again.
    h.command(Command::LaneIdle {
        lane: 1,
        tokens: vec![2; 6],
    });
    h.command(Command::LaneIdle {
        lane: 0,
        tokens: vec![1; 6],
    });
    // A prompt that extends lane 1's session goes to lane 1, though lane 0
    // is as free and lower.
    h.submit(2, 8, 4).unwrap();
    assert!(h.started(0).is_none());
    assert_eq!(h.started(1).unwrap().id, 2, "the lane holding its prefix");
}

#[test]
fn stop_and_shutdown_refuse_new_jobs_and_drop_the_waiting() {
    let mut h = harness(1, 1000);
    h.submit(1, 4, 4).unwrap();
    let running = h.started(0).unwrap();
    h.submit(2, 4, 4).unwrap();
    h.command(Command::StopTurns);
    assert!(running.cancel.is_cancelled());
    assert_eq!(h.status().waiting, 0);
    let (reply, _done) = oneshot::channel();
    h.command(Command::Shutdown { reply });
    assert_eq!(h.submit(3, 4, 4), Err(Rejected::Stopped));
    // A lane that ends is never given a job again.
    h.command(Command::LaneGone { lane: 0 });
    assert!(!h.scheduler.lanes[0].free());
}
