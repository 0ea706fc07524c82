/*
 * A stand-in for pyxis (NVIDIA's container plugin for Slurm) on a machine without containers:
 * a SPANK plugin that registers pyxis's srun/sbatch options, so that NeMo-RL's ray.sub (which
 * always passes --container-image, --container-mounts, ...) is accepted, and then does nothing:
 * every step runs on the host. Only for testing the submission path (scripts/test_slurm.sh).
 *
 * Build: cc -shared -fPIC -o pyxis_standin.so pyxis_standin.c  (slurm/spank.h: libslurm-dev)
 * Use:   plugstack.conf: "required /path/to/pyxis_standin.so"
 */
#include <slurm/spank.h>
#include <stddef.h>

SPANK_PLUGIN(pyxis_standin, 1);

/* Accept the value and ignore it: there is no container to configure. */
static int ignore(int val, const char *optarg, int remote)
{
    (void)val;
    (void)optarg;
    (void)remote;
    return 0;
}

#define TAKES_VALUE(name, arg) { name, arg, "pyxis stand-in: accepted, ignored", 1, 0, ignore }
#define FLAG(name) { name, NULL, "pyxis stand-in: accepted, ignored", 0, 0, ignore }

/* pyxis 0.20's options (what ray.sub uses and the rest, so that any of them is accepted). */
static struct spank_option options[] = {
    TAKES_VALUE("container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH"),
    TAKES_VALUE("container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]"),
    TAKES_VALUE("container-workdir", "PATH"),
    TAKES_VALUE("container-name", "NAME"),
    TAKES_VALUE("container-save", "PATH"),
    TAKES_VALUE("container-env", "NAME[,NAME...]"),
    FLAG("container-mount-home"),
    FLAG("no-container-mount-home"),
    FLAG("container-remap-root"),
    FLAG("no-container-remap-root"),
    FLAG("container-entrypoint"),
    FLAG("no-container-entrypoint"),
    FLAG("container-entrypoint-log"),
    FLAG("container-writable"),
    FLAG("container-readonly"),
    SPANK_OPTIONS_TABLE_END,
};

/* Registered here rather than through a spank_options table, so that sbatch and salloc
 * accept them too (as with pyxis). */
int slurm_spank_init(spank_t spank, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    for (struct spank_option *option = options; option->name != NULL; option++) {
        if (spank_option_register(spank, option) != ESPANK_SUCCESS) {
            slurm_error("pyxis_standin: cannot register --%s", option->name);
            return -1;
        }
    }
    return 0;
}
