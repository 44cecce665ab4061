#!/usr/bin/env bash
# scripts/sass.sh --counts on a made-up disassembly (CI has no cuobjdump): the kernel's name
# and template arguments from its mangled name (the anonymous-namespace hash left out), the
# counts, and the R2URs between two wgmmas of a run, not those before a run's first one
# or after a wait.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/a.sass" <<'SASS'
	code for sm_90
		Function : _ZN8flashgpt4cuda4attn59_GLOBAL__N__b43ac9bb_20_flash_fwd_sm90_ws_cu_c95fa4b9_2385835flash_fwd_sm90_ws_persistent_kernelINS2_10Sm90WsTileILi64ELi128ELi2ELi1EEELb1EEEv14CUtensorMap_stS6_S6_NS1_11FlashParamsE
        /*0000*/                   R2UR UR8, R6 ;                                  /* 0x0 */
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ; /* 0x0 */
        /*0020*/                   R2UR UR8, R8 ;                                  /* 0x0 */
        /*0030*/              @!P0 R2UR UR9, R9 ;                                  /* 0x0 */
        /*0040*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ; /* 0x0 */
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;                 /* 0x0 */
        /*0060*/                   R2UR UR10, R10 ;                                /* 0x0 */
        /*0070*/                   MUFU.EX2 R1, R1 ;                               /* 0x0 */
        /*0080*/                   HGMMA.64x64x16.F32.BF16 R88, R120, gdesc[UR8].tnspB, R88 ; /* 0x0 */
        /*0090*/                   EXIT ;                                          /* 0x0 */
		.........
		Function : _ZN8flashgpt4cuda4attn59_GLOBAL__N__b43ac9bb_20_flash_fwd_sm90_ws_cu_c95fa4b9_2385824flash_fwd_sm90_ws_kernelINS2_10Sm90WsTileILi128ELi176ELi2ELi1EEELb0EEEv14CUtensorMap_stS6_NS1_11FlashParamsE
        /*0000*/                   EXIT ;                                          /* 0x0 */
SASS
out=$(bash scripts/sass.sh --counts "$tmp/a.sass" "$tmp/a.sass" 2>&1); rc=$?
echo "$out"
[[ $rc == 0 ]] || { echo "FAIL: rc $rc"; exit 1; }
grep -Eq '^flash_fwd_sm90_ws_persistent_kernel<64,128,2,1,b1> +10 4 3 1 2 +\| +10 4 3 1 2$' <<< "$out" ||
  { echo "FAIL: the persistent kernel's counts"; exit 1; }
grep -Eq '^flash_fwd_sm90_ws_kernel<128,176,2,1,b0> +1 0 0 0 0 ' <<< "$out" || { echo "FAIL: the grid kernel"; exit 1; }
echo "sass_counts: ok"
