"""How the harness measures on Ray: the cluster and the fleet of shared actors (`cluster`), the
contenders of the balancing scenarios (`contenders`), the open-loop driver that plays a plan
through one of them (`driver`), the repeats of a balancing scenario (`runner`), closed-loop
contenders timed turn by turn (`trials`), the order contenders take turns in (`turns`), what the
actors do (`workloads`), the metrics of a run (`metrics`), the results section every scenario
returns (`section`) and what a scenario is given to run (`context`)."""
