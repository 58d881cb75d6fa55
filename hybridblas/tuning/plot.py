"""Each device's rate against problem size, one panel per routine (matplotlib, optional)."""


def plot_rates(profile, path):
    devices = profile.to_dict()["devices"]
    routines = sorted({r for e in devices.values() for r in e.get("rates", {})})
    if not routines:
        raise ValueError("the profile holds no rates to plot")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(routines), figsize=(4 * len(routines), 3.5), squeeze=False)
    for ax, routine in zip(axes[0], routines):
        for name, e in devices.items():
            for dt, table in e.get("rates", {}).get(routine, {}).items():
                sizes = sorted(table)
                ax.plot(sizes, [table[n] / 1e12 for n in sizes], marker="o", label=f"{name} {dt}")
        ax.set_xscale("log", base=2)
        ax.set_title(routine)
        ax.set_xlabel("n (= k)")
        ax.set_ylabel("TFLOP/s")
        ax.legend(fontsize=6)
    fig.suptitle(f"hybridblas profile {profile.id}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
