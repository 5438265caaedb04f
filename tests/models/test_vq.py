import torch
import torch.nn.functional as F

from lisa_trt.models.target_config import vq_config
from lisa_trt.families.llamagen.vq import VQModel


def small_vq():
    torch.manual_seed(0)
    return VQModel(vq_config("VQ-8", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2),
                             z_channels=32, codebook_size=64)).eval()


def test_param_counts_match_official():
    with torch.device("meta"):
        n16 = sum(p.numel() for p in VQModel(vq_config("VQ-16")).parameters())
        n8 = sum(p.numel() for p in VQModel(vq_config("VQ-8")).parameters())
    assert round(n16 / 1e6, 1) == 71.9 and round(n8 / 1e6, 1) == 70.1


def test_encode_is_nearest_normalised_codebook_row():
    vq = small_vq()
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    idx = vq.encode(x)
    assert idx.shape == (2, 64)
    z = F.normalize(vq.encode_latent(x).permute(0, 2, 3, 1).reshape(-1, 8), dim=-1)
    E = F.normalize(vq.quantize.embedding.weight, dim=-1)
    assert torch.equal(idx.reshape(-1), torch.cdist(z, E).argmin(1))


def test_decode_code_layout():
    vq = small_vq()
    idx = torch.randint(0, 64, (2, 64))
    q = vq.quantize.get_codebook_entry(idx, (2, 8, 8, 8))
    E = vq.codebook()
    # (B, h*w) row-major -> (B, C, h, w): position (r, c) holds code idx[:, r*8 + c]
    assert torch.equal(q[1, :, 2, 5], E[idx[1, 2 * 8 + 5]])
    assert vq.decode_code(idx, (2, 8, 8, 8)).shape == (2, 3, 16, 16)
