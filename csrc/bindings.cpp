// The Python face of the scheduler: the only file that knows about Python.
// nanobind_add_module adds nanobind's headers as ordinary includes, and they trip -Wshadow;
// silence that one warning for them only, our own code stays under -Werror.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#pragma GCC diagnostic pop

#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "bench.hpp"
#include "scheduler.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using actormesh::Candidates;
using actormesh::Decision;
using actormesh::Drain;
using actormesh::Picker;
using actormesh::Scheduler;
using actormesh::Settings;
using actormesh::Status;

namespace {

// A decision as Python sees it: one Ray task, with the payloads its calls were queued with. A
// lone call is a task of one; `ticket` and `payload` are its first call's.
struct PyDecision {
  uint64_t ticket;
  int32_t actor;
  nb::object payload;
  std::vector<uint64_t> tickets;
  nb::list payloads;
};

// Payloads cross into the core as the address of a Python object the core owns one reference
// to, from submit() until the call leaves its queue; 0 means none.
uint64_t to_core(nb::handle payload) {
  return payload.is_none() ? 0 : reinterpret_cast<uint64_t>(payload.ptr());
}

// Takes back the reference the core owned. The GIL must be held.
nb::object from_core(uint64_t payload) {
  return payload == 0 ? nb::none() : nb::steal(reinterpret_cast<PyObject*>(payload));
}

// One PyDecision per task: a decision that opens a task (calls >= 1) and the mates after it.
std::vector<PyDecision> from_core(std::vector<Decision>&& decisions) {
  std::vector<PyDecision> out;
  out.reserve(decisions.size());
  for (const Decision& d : decisions) {
    nb::object payload = from_core(d.payload);
    if (d.calls == 0 && !out.empty()) {
      out.back().tickets.push_back(d.ticket);
      out.back().payloads.append(payload);
      continue;
    }
    PyDecision task{d.ticket, d.actor, payload, {d.ticket}, nb::list()};
    task.tickets.reserve(d.calls);
    task.payloads.append(std::move(payload));
    out.push_back(std::move(task));
  }
  return out;
}

const char* status_name(Status status) {
  switch (status) {
    case Status::alive:
      return "alive";
    case Status::restarting:
      return "restarting";
    case Status::dead:
      return "dead";
  }
  return "unknown";
}

// What a setting of each C++ type takes from Python, for errors.
template <typename T>
const char* python_kind() {
  if constexpr (std::is_same_v<T, bool>) {
    return "a bool";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a str";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "a float";
  } else if constexpr (std::is_unsigned_v<T>) {
    return "an int >= 0";
  } else {
    return "an int";
  }
}

// One setting's value from Python; a TypeError naming the setting when it does not fit.
template <typename T>
T setting_value(const char* name, nb::handle value) {
  T out;
  if (!nb::try_cast(value, out)) {
    const std::string message = std::string(name) + "=" + nb::repr(value).c_str() +
                                ": expected " + python_kind<T>();
    throw nb::type_error(message.c_str());
  }
  return out;
}

// The settings named by Python keyword arguments (settings.hpp lists them), the rest default.
Settings settings_from(std::string policy, const nb::kwargs& kwargs) {
  Settings settings;
  settings.policy = std::move(policy);
  for (const auto& [key, value] : kwargs) {
    const std::string name = nb::cast<std::string>(key);
    bool known = false;
#define ACTORMESH_SET_SETTING(type, field, default_value)         \
    if (name == #field) {                                          \
      settings.field = setting_value<type>(#field, value);         \
      known = true;                                                \
    }
    ACTORMESH_SETTINGS(ACTORMESH_SET_SETTING)
#undef ACTORMESH_SET_SETTING
    if (!known) {
      const std::string message = "Scheduler(): '" + name + "' is no setting (csrc/settings.hpp)";
      throw nb::type_error(message.c_str());
    }
  }
  return settings;
}

// Every setting's default, by name: `_native.SETTINGS`.
nb::dict setting_defaults() {
  const Settings defaults;
  nb::dict out;
#define ACTORMESH_SETTING_DEFAULT(type, field, default_value) out[#field] = defaults.field;
  ACTORMESH_SETTINGS(ACTORMESH_SETTING_DEFAULT)
#undef ACTORMESH_SETTING_DEFAULT
  return out;
}

// actormesh._native.PickerError; the module holds the reference.
PyObject* picker_error_type = nullptr;

// True while this thread runs a Python picker, which holds its scheduler's mutex.
thread_local bool in_picker = false;

struct PickerScope {
  PickerScope() { in_picker = true; }
  ~PickerScope() { in_picker = false; }
};

// Runs `work` under the scheduler's mutex with the GIL rule for its policy. Built-in policies do
// tens of nanoseconds of work under a mutex that is then never contended (every caller holds the
// GIL), so the GIL stays held. With a Python picker the GIL is released before the mutex is taken:
// the thread inside the scheduler re-acquires the GIL to call the picker, and a thread waiting for
// the mutex while holding the GIL would deadlock it. For the same reason a picker cannot call back
// into such a scheduler: its own thread holds the mutex.
template <typename Work>
auto with_gil_rule(const Scheduler& scheduler, Work&& work) -> decltype(work()) {
  if (!scheduler.uses_picker()) return work();
  if (in_picker) {
    throw std::logic_error("a picker cannot call a scheduler that uses a picker (it would wait "
                           "for the lock held while it picks)");
  }
  nb::gil_scoped_release release;
  return work();
}

// Affinity keys are 64-bit hashes: a signed `hash()` or an unsigned digest, both accepted.
std::optional<uint64_t> affinity_key(nb::handle key) {
  if (key.is_none()) return std::nullopt;
  int64_t signed_key;
  if (nb::try_cast(key, signed_key)) return static_cast<uint64_t>(signed_key);
  uint64_t unsigned_key;
  if (nb::try_cast(key, unsigned_key)) return unsigned_key;
  const std::string message = "affinity " + std::string(nb::repr(key).c_str()) +
                              ": expected None or an int in [-2**63, 2**64)";
  throw nb::type_error(message.c_str());
}

// complete()'s count of failed calls. A bool is refused: it was the outcome of the whole task
// (`ok`) before failures were counted per call, and True would now read as one failure.
int64_t failed_calls(nb::handle failed) {
  int64_t count;
  if (PyBool_Check(failed.ptr()) || !nb::try_cast(failed, count)) {
    const std::string message = "failed=" + std::string(nb::repr(failed).c_str()) +
                                ": expected an int, how many of the task's calls failed";
    throw nb::type_error(message.c_str());
  }
  return count;
}

// The Python picker, shared by the core's callback and the Python object so that the garbage
// collector can see it: a picker that refers back to its scheduler (a bound method of the mesh
// that owns it) forms a cycle that must stay collectable.
using PickerRef = std::shared_ptr<nb::object>;

// Calls the Python picker with the GIL held. Errors are raised as Python exceptions so that the
// scheduler can carry them across a drain unchanged; the index itself is validated by the core.
Picker wrap_picker(PickerRef picker) {
  return [picker = std::move(picker)](const Candidates& c) -> int64_t {
    nb::gil_scoped_acquire gil;
    if (!picker->is_valid()) {
      PyErr_SetString(PyExc_RuntimeError, "picker called on a scheduler being collected");
      throw nb::python_error();
    }
    nb::object affinity = c.affinity ? nb::cast(*c.affinity) : nb::none();
    // Borrowed: the call's payload is owned by the caller of submit, or by its queue.
    nb::handle payload = c.payload == 0 ? nb::handle(Py_None)
                                        : nb::handle(reinterpret_cast<PyObject*>(c.payload));
    nb::object result;
    {
      const PickerScope picking;
      result = (*picker)(nb::cast(c.ranks), nb::cast(c.in_flight), nb::cast(c.mean_latency_s),
                         affinity, payload);
    }
    int64_t index;
    if (!nb::try_cast(result, index)) {
      const std::string message = "picker returned " + std::string(nb::repr(result).c_str()) +
                                  ", expected an int index into the candidates";
      PyErr_SetString(PyExc_TypeError, message.c_str());
      throw nb::python_error();
    }
    return index;
  };
}

// The Python-facing scheduler: the core plus the picker reference, and the owner of the queued
// calls' payloads, which the garbage collector must see (a payload that refers back to the
// scheduler forms a cycle).
struct PyScheduler : Scheduler {
  PyScheduler(int64_t num_actors, Settings settings, PickerRef picker_ref)
      : Scheduler(num_actors, std::move(settings)), picker(std::move(picker_ref)) {}
  ~PyScheduler() { drop_queued(); }
  PyScheduler(const PyScheduler&) = delete;
  PyScheduler& operator=(const PyScheduler&) = delete;

  // Releases the payloads of every queued call. The GIL must be held.
  void drop_queued() { from_core(take_queued()); }

  PickerRef picker;  // null without a picker
  // Called, without arguments, after a submit, complete or mark_alive that ejected or readmitted
  // an actor (see tell_ejections); None: nobody is told.
  nb::object on_ejections = nb::none();
  uint64_t told = 0;  // ejection_events() when last told; read and written under the GIL
};

// Calls `on_ejections` once if an actor was ejected or readmitted since it was last called, on
// the thread of the call that did it (Ray's completion thread, for complete). The check is one
// load and one comparison on the call path. An exception of the callback is reported as
// unraisable: the call it follows has happened and must return its decisions.
void tell_ejections(PyScheduler& s) {
  const uint64_t events = s.ejection_events();
  if (events == s.told) return;
  s.told = events;
  if (s.on_ejections.is_none()) return;
  try {
    s.on_ejections();
  } catch (nb::python_error& e) {
    e.discard_as_unraisable("actormesh._native.Scheduler.on_ejections");
  }
}

int scheduler_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;  // __init__ has not finished
  const PyScheduler* scheduler = nb::inst_ptr<PyScheduler>(self);
  if (scheduler->picker) Py_VISIT(scheduler->picker->ptr());
  Py_VISIT(scheduler->on_ejections.ptr());
  int result = 0;
  // Busy (another thread inside it): its payloads are reachable from that thread anyway, and
  // the collector must not wait. They are visited at a later collection.
  scheduler->try_visit_payloads([&](uint64_t payload) {
    if (result == 0 && payload != 0) result = visit(reinterpret_cast<PyObject*>(payload), arg);
  });
  return result;
}

int scheduler_clear(PyObject* self) {
  PyScheduler* scheduler = nb::inst_ptr<PyScheduler>(self);
  if (scheduler->picker) scheduler->picker->reset();
  scheduler->on_ejections = nb::none();
  scheduler->drop_queued();
  return 0;
}

PyType_Slot scheduler_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(scheduler_traverse)},
                                 {Py_tp_clear, reinterpret_cast<void*>(scheduler_clear)},
                                 {0, nullptr}};

// The exception a failed pick left in a drain, as a Python exception object.
nb::object python_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (nb::python_error& e) {
    return nb::borrow(e.value());
  } catch (const std::invalid_argument& e) {
    return nb::handle(PyExc_ValueError)(e.what());
  } catch (const std::exception& e) {
    return nb::handle(PyExc_RuntimeError)(e.what());
  }
}

// Hands a drain's dispatches to Python, with their payloads. When the picker failed on queued
// calls, nothing is lost: PickerError carries `dispatched` (calls to run, as if returned) and
// `failed` (calls removed from their queue, to fail), with the picker's exception as __cause__.
std::vector<PyDecision> finish(Drain&& drain) {
  std::vector<PyDecision> dispatched = from_core(std::move(drain.dispatched));
  if (drain.failed.empty()) return dispatched;
  std::vector<PyDecision> failed = from_core(std::move(drain.failed));
  nb::object cause = python_exception(drain.error);
  const std::string message =
      "picker failed on " + std::to_string(drain.failed.size()) + " queued call(s) (" +
      std::string(nb::str(cause.type().attr("__name__")).c_str()) + ": " +
      std::string(nb::str(cause).c_str()) + "); see .failed and .dispatched";
  nb::object error = nb::handle(picker_error_type)(message);
  error.attr("dispatched") = nb::cast(std::move(dispatched));
  error.attr("failed") = nb::cast(std::move(failed));
  PyException_SetCause(error.ptr(), cause.release().ptr());
  PyErr_SetObject(picker_error_type, error.ptr());
  throw nb::python_error();
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "The native scheduler behind ActorMesh.choose (see csrc/API.md).";
  // A mesh the user never shut down is still referenced at exit by Ray's pending completion
  // callbacks (its death watches), so its scheduler outlives the interpreter: not a refcount bug.
  nb::set_leak_warnings(false);

  nb::exception<actormesh::NoLiveActors>(m, "NoLiveActors", PyExc_RuntimeError);
  picker_error_type = PyErr_NewExceptionWithDoc(
      "actormesh._native.PickerError",
      "An external picker raised while queued calls were being dispatched. `dispatched` lists the "
      "calls that were dispatched anyway (run them), `failed` the tickets that were taken out of "
      "their queue (fail them); __cause__ is the picker's exception.",
      PyExc_RuntimeError, nullptr);
  m.attr("PickerError") = nb::steal(picker_error_type);

  nb::class_<PyDecision>(m, "Decision",
                         "Where one Ray task goes: `actor` -1 means its call was queued (from "
                         "submit) or can never run. `payload` is what its (first) call was "
                         "queued with; `tickets` and `payloads` list every call it carries.")
      .def(
          "__init__",
          [](PyDecision* self, uint64_t ticket, int32_t actor, nb::object payload) {
            nb::list payloads;
            payloads.append(payload);
            new (self) PyDecision{ticket, actor, std::move(payload), {ticket}, payloads};
          },
          "ticket"_a, "actor"_a, "payload"_a = nb::none())
      .def_ro("ticket", &PyDecision::ticket)
      .def_ro("actor", &PyDecision::actor)
      .def_ro("payload", &PyDecision::payload)
      .def_ro("tickets", &PyDecision::tickets)
      .def_ro("payloads", &PyDecision::payloads)
      .def("__repr__", [](const PyDecision& d) {
        std::string tickets;
        for (const uint64_t t : d.tickets) tickets += (tickets.empty() ? "" : ", ") + std::to_string(t);
        return "Decision(ticket=" + std::to_string(d.ticket) +
               ", actor=" + std::to_string(d.actor) +
               (d.tickets.size() > 1 ? ", tickets=[" + tickets + "]" : std::string()) + ")";
      });

  nb::class_<PyScheduler>(m, "Scheduler", "Which actor of a mesh gets each call (see csrc/API.md).",
                          nb::type_slots(scheduler_slots))
      .def(
          "__init__",
          [](PyScheduler* self, int64_t num_actors, std::string policy,
             std::optional<nb::callable> picker, const nb::kwargs& settings_kwargs) {
            Settings settings = settings_from(std::move(policy), settings_kwargs);
            PickerRef picker_ref;
            if (picker) {
              picker_ref = std::make_shared<nb::object>(std::move(*picker));
              settings.picker = wrap_picker(picker_ref);
            }
            new (self) PyScheduler(num_actors, std::move(settings), std::move(picker_ref));
          },
          "num_actors"_a, "policy"_a = "pow2", nb::kw_only(), "picker"_a = nb::none(),
          "settings"_a,
          nb::sig("def __init__(self, num_actors: int, policy: str = 'pow2', *, "
                  "picker: Picker | None = None, **settings: Unpack[SchedulerSettings]) "
                  "-> None"))
      .def(
          "add_group",
          [](PyScheduler& s, const std::vector<int64_t>& members) {
            return with_gil_rule(s, [&] { return s.add_group(members); });
          },
          "members"_a)
      .def(
          "remove_group",
          [](PyScheduler& s, int64_t group) { with_gil_rule(s, [&] { s.remove_group(group); }); },
          "group"_a)
      .def("num_groups",
           [](PyScheduler& s) { return with_gil_rule(s, [&] { return s.num_groups(); }); })
      .def(
          "group_members",
          [](PyScheduler& s, int64_t group) {
            return with_gil_rule(s, [&] { return s.group_members(group); });
          },
          "group"_a)
      .def(
          "add_method",
          [](PyScheduler& s, bool alone) {
            return with_gil_rule(s, [&] { return s.add_method(alone); });
          },
          "alone"_a = false)
      .def(
          "method_latency_s",
          [](PyScheduler& s, int64_t method) {
            return with_gil_rule(s, [&] { return s.method_latency_s(method); });
          },
          "method"_a)
      .def(
          "method_quantile_s",
          [](PyScheduler& s, int64_t method, double q) {
            return with_gil_rule(s, [&] { return s.method_quantile_s(method, q); });
          },
          "method"_a, "q"_a)
      .def(
          "batch_size",
          [](PyScheduler& s, int64_t method) {
            return with_gil_rule(s, [&] { return s.batch_size(method); });
          },
          "method"_a)
      .def(
          "submit",
          [](PyScheduler& s, int64_t group, nb::handle affinity, nb::object payload,
             std::optional<double> now_s, int64_t method, bool alone) {
            const std::optional<uint64_t> key = affinity_key(affinity);
            const double now = now_s.value_or(std::numeric_limits<double>::quiet_NaN());
            const Decision d = with_gil_rule(s, [&] {
              return s.submit(group, key, to_core(payload), now, method, alone);
            });
            tell_ejections(s);
            // Queued: the core keeps the payload, and with it one reference.
            if (d.actor < 0 && !payload.is_none()) payload.release();
            return PyDecision{d.ticket, d.actor, nb::none(), {d.ticket}, nb::list()};
          },
          "group"_a, "affinity"_a = nb::none(), "payload"_a = nb::none(),
          "now_s"_a = nb::none(), "method"_a = 0, "alone"_a = false,
          nb::sig("def submit(self, group: int, affinity: int | None = None, "
                  "payload: object = None, now_s: float | None = None, method: int = 0, "
                  "alone: bool = False) -> Decision"))
      .def(
          "hedge",
          [](PyScheduler& s, int64_t group, int64_t first, bool idle) {
            return with_gil_rule(s, [&] { return s.hedge(group, first, idle); });
          },
          "group"_a, "first"_a, "idle"_a = true)
      .def("hold_deadline_s",
           [](PyScheduler& s) { return with_gil_rule(s, [&] { return s.hold_deadline_s(); }); })
      .def(
          "expire_holds",
          [](PyScheduler& s, double now_s) {
            return finish(with_gil_rule(s, [&] { return s.expire_holds(now_s); }));
          },
          "now_s"_a)
      .def(
          "complete",
          [](PyScheduler& s, int64_t actor, double started_s, double ended_s, nb::handle failed,
             bool drain, int64_t calls, int64_t method, bool timed, double busy_s,
             int64_t failed_first, int64_t failed_longest, int64_t failed_last) {
            const int64_t count = failed_calls(failed);
            actormesh::FailureRun run;
            if (failed_first >= 0) {
              if (failed_first > calls || failed_longest < 0 || failed_longest > calls ||
                  failed_last < 0 || failed_last > calls) {
                throw std::invalid_argument(
                    "complete: failed_first " + std::to_string(failed_first) +
                    ", failed_longest " + std::to_string(failed_longest) + ", failed_last " +
                    std::to_string(failed_last) + ": each must be in [0, failed]");
              }
              run = actormesh::FailureRun{failed_first, static_cast<uint32_t>(failed_longest),
                               static_cast<uint32_t>(failed_last)};
            }
            Drain drained = with_gil_rule(s, [&] {
              return s.complete(actor, started_s, ended_s, count, drain, calls, method, timed,
                                busy_s, run);
            });
            tell_ejections(s);
            return finish(std::move(drained));
          },
          "actor"_a, "started_s"_a, "ended_s"_a, "failed"_a, "drain"_a = true, "calls"_a = 1,
          "method"_a = 0, "timed"_a = true,
          "busy_s"_a = std::numeric_limits<double>::quiet_NaN(), "failed_first"_a = -1,
          "failed_longest"_a = 0, "failed_last"_a = 0,
          nb::sig("def complete(self, actor: int, started_s: float, ended_s: float, failed: int, "
                  "drain: bool = True, calls: int = 1, method: int = 0, timed: bool = True, "
                  "busy_s: float = ..., failed_first: int = -1, failed_longest: int = 0, "
                  "failed_last: int = 0) -> list[Decision]"))
      .def(
          "drain",
          [](PyScheduler& s, int64_t actor) {
            return finish(with_gil_rule(s, [&] { return s.drain(actor); }));
          },
          "actor"_a)
      .def(
          "release",
          [](PyScheduler& s, int64_t actor, bool drain, int64_t calls, bool task) {
            return finish(with_gil_rule(s, [&] { return s.release(actor, drain, calls, task); }));
          },
          "actor"_a, "drain"_a = true, "calls"_a = 1, "task"_a = true)
      .def(
          "acquire",
          [](PyScheduler& s, int64_t actor) { with_gil_rule(s, [&] { s.acquire(actor); }); },
          "actor"_a)
      .def(
          "cancel",
          [](PyScheduler& s, uint64_t ticket) {
            const std::optional<uint64_t> payload =
                with_gil_rule(s, [&] { return s.cancel(ticket); });
            if (payload) from_core(*payload);  // released here
            return payload.has_value();
          },
          "ticket"_a)
      .def(
          "mark_dead",
          [](PyScheduler& s, int64_t actor, bool restarting) {
            return from_core(with_gil_rule(s, [&] { return s.mark_dead(actor, restarting); }));
          },
          "actor"_a, "restarting"_a = false)
      .def(
          "mark_alive",
          [](PyScheduler& s, int64_t actor) {
            Drain drained = with_gil_rule(s, [&] { return s.mark_alive(actor); });
            tell_ejections(s);
            return finish(std::move(drained));
          },
          "actor"_a)
      .def("take_queued",
           [](PyScheduler& s) { return from_core(with_gil_rule(s, [&] { return s.take_queued(); })); })
      .def("snapshot",
           [](PyScheduler& s) {
             const std::vector<Scheduler::ActorState> states =
                 with_gil_rule(s, [&] { return s.snapshot(); });
             nb::list out;
             for (const Scheduler::ActorState& a : states) {
               out.append(nb::make_tuple(a.in_flight, a.tasks, a.mean_latency_s,
                                         status_name(a.status), a.ejected, a.others));
             }
             return out;
           },
           nb::sig("def snapshot(self) -> list[tuple[int, int, float, str, bool, int]]"))
      .def(
          "share_load",
          [](PyScheduler& s, std::optional<std::string> path) {
            with_gil_rule(s, [&] { s.share_load(path); });
          },
          "path"_a.none())
      .def("unshare_load", [](PyScheduler& s) { with_gil_rule(s, [&] { s.unshare_load(); }); })
      .def(
          "set_remote_load",
          [](PyScheduler& s, const std::vector<uint32_t>& calls) {
            with_gil_rule(s, [&] { s.set_remote_load(calls); });
          },
          "calls"_a)
      .def("load_table_id",
           [](PyScheduler& s) { return with_gil_rule(s, [&] { return s.load_table_id(); }); })
      .def("in_flight",
           [](PyScheduler& s) { return with_gil_rule(s, [&] { return s.in_flight(); }); })
      .def("tasks", [](PyScheduler& s) { return with_gil_rule(s, [&] { return s.tasks(); }); })
      .def("mean_latency_s",
           [](PyScheduler& s) { return with_gil_rule(s, [&] { return s.mean_latency_s(); }); })
      .def("alive", [](PyScheduler& s) { return with_gil_rule(s, [&] { return s.alive(); }); })
      .def("status",
           [](PyScheduler& s) {
             const std::vector<Status> status = with_gil_rule(s, [&] { return s.status(); });
             std::vector<std::string> out;
             out.reserve(status.size());
             for (const Status st : status) out.emplace_back(status_name(st));
             return out;
           })
      .def("ejected",
           [](PyScheduler& s) { return with_gil_rule(s, [&] { return s.ejected(); }); })
      .def("ejections",
           [](PyScheduler& s) {
             const std::vector<Scheduler::Ejections> counts =
                 with_gil_rule(s, [&] { return s.ejections(); });
             nb::list out;
             for (const Scheduler::Ejections& c : counts) {
               out.append(nb::make_tuple(c.ejected, c.readmitted));
             }
             return out;
           },
           nb::sig("def ejections(self) -> list[tuple[int, int]]"))
      .def(
          "on_ejections",
          [](PyScheduler& s, nb::object callback) {  // not optional<callable>: GCC 13 warns
            if (!callback.is_none() && !nb::isinstance<nb::callable>(callback)) {
              const std::string got = nb::inst_name(callback).c_str();
              throw nb::type_error(
                  ("on_ejections: callback must be callable or None, not " + got).c_str());
            }
            s.on_ejections = std::move(callback);
          },
          "callback"_a.none(),
          nb::sig("def on_ejections(self, callback: Callable[[], object] | None) -> None"))
      .def("queued", [](PyScheduler& s) { return with_gil_rule(s, [&] { return s.queued(); }); })
      .def_prop_ro("num_actors", [](const PyScheduler& s) { return s.num_actors(); })
      .def_prop_ro("policy", [](const PyScheduler& s) { return s.policy(); })
      .def_prop_ro("max_in_flight", [](const PyScheduler& s) { return s.max_in_flight(); })
      .def_prop_ro("max_tasks", [](const PyScheduler& s) { return s.max_tasks(); })
      .def_prop_ro("eject_after", [](const PyScheduler& s) { return s.eject_after(); })
      .def_prop_ro("coalesce", [](const PyScheduler& s) { return s.coalesce(); })
      .def_prop_ro("affinity_capacity",
                   [](const PyScheduler& s) { return s.affinity_capacity(); })
      .def_prop_ro("may_hold", [](const PyScheduler& s) { return s.may_hold(); });

  m.attr("SETTINGS") = setting_defaults();

  m.def("measure_decision_ns", &actormesh::measure_decision_ns, "policy"_a, "num_actors"_a,
        "decisions"_a, "seed"_a = 0, nb::call_guard<nb::gil_scoped_release>(),
        "Nanoseconds per submit + complete pair in a C++ loop, ~num_actors/2 calls in flight.");
}
